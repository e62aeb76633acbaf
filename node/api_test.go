package node

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestInfoViewJSON checks that a field added with WithInfo is written as a
// field of InfoView's own would be: the same bytes as a struct that has it
// as its last field with omitempty, indented as the API writes.
func TestInfoViewJSON(t *testing.T) {
	type faultSettings struct {
		Drop  float64  `json:"drop"`
		Peers []string `json:"peers,omitempty"`
		Note  string   `json:"note"`
	}
	type withField struct {
		PeerID    string   `json:"peer_id"`
		Addrs     []string `json:"addrs"`
		Network   string   `json:"network"`
		Version   string   `json:"version"`
		WorkTypes []string `json:"work_types"`
		Labels    []string `json:"labels"`
		Faults    any      `json:"faults,omitempty"`
	}
	indented := func(v any) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	base := InfoView{PeerID: "12D3KooW", Addrs: []string{"/ip4/127.0.0.1/udp/1/quic-v1/p2p/12D3KooW"}, Network: "workmesh",
		Version: "dev", WorkTypes: []string{"echo", "sha256"}, Labels: []string{}}
	want := withField{base.PeerID, base.Addrs, base.Network, base.Version, base.WorkTypes, base.Labels, nil}
	for _, value := range []any{nil, faultSettings{Drop: 0.5, Peers: []string{"a"}, Note: "<drill> & co"}, map[string]int{"b": 2, "a": 1}} {
		v, w := base, want
		v.Extra = []InfoField{{Key: "faults", Value: value}}
		w.Faults = value
		if got, want := indented(v), indented(w); got != want {
			t.Errorf("with %v:\n%s\nwant\n%s", value, got, want)
		}
	}
	if got, want := indented(base), indented(want); got != want {
		t.Errorf("without extra fields:\n%s\nwant\n%s", got, want)
	}
}

func TestWithInfoRefusesTakenKeys(t *testing.T) {
	view := func() any { return 1 }
	for _, opts := range [][]Option{
		{WithInfo("peer_id", view)},
		{WithInfo("work_types", view)},
		{WithInfo("faults", view), WithInfo("faults", view)},
		{WithInfo("", view)},
		{WithInfo("faults", nil)},
	} {
		var o options
		var err error
		for _, opt := range opts {
			if err = opt(&o); err != nil {
				break
			}
		}
		if err == nil {
			t.Errorf("%d options accepted, keys %v", len(opts), o.info)
		}
	}
}
