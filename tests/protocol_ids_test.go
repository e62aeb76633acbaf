package tests

import (
	"testing"

	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers/protocol"
)

// TestWorkProtocolIDsAgree: the host's stream limits for the work protocol
// (node, which may not import workers) name the ID the work server serves.
func TestWorkProtocolIDsAgree(t *testing.T) {
	for _, network := range []string{"devnet", "a-b_c.9"} {
		if got, want := node.WorkProtocol(network), protocol.ProtocolID(network); got != want {
			t.Errorf("network %q: node.WorkProtocol %s, protocol.ProtocolID %s", network, got, want)
		}
	}
}
