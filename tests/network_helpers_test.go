package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/tests/testkit"
)

// loopbackQUIC is the only listen address tests use: loopback, random port.
const loopbackQUIC = "/ip4/127.0.0.1/udp/0/quic-v1"

// testLogger discards logs unless WORKMESH_TEST_LOG names a level.
func testLogger() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	if lvl := os.Getenv("WORKMESH_TEST_LOG"); lvl != "" {
		if l, err := logrus.ParseLevel(lvl); err == nil {
			log.SetOutput(os.Stderr)
			log.SetLevel(l)
		}
	}
	return log
}

// nodeSpec describes one test node.
type nodeSpec struct {
	workTypes []string
	labels    []string
	announce  time.Duration
	ttl       time.Duration
}

// testNodeConfig returns a node config on loopback with a random port, no
// HTTP API and a fresh data dir.
func testNodeConfig(t testing.TB, spec nodeSpec, bootstrap []string) config.NodeConfig {
	cfg := config.Defaults().Node
	cfg.Listen = []string{loopbackQUIC}
	cfg.API = ""
	cfg.DataDir = t.TempDir()
	cfg.Bootstrap = bootstrap
	cfg.WorkTypes = spec.workTypes
	cfg.Labels = spec.labels
	if spec.announce > 0 {
		cfg.AnnounceInterval = spec.announce
	}
	if spec.ttl > 0 {
		cfg.RecordTTL = spec.ttl
	}
	return cfg
}

// startNode starts a node and closes it when the test ends.
func startNode(t testing.TB, cfg config.NodeConfig, opts ...node.Option) *node.Node {
	t.Helper()
	opts = append([]node.Option{node.WithLogger(testLogger())}, opts...)
	n, err := node.New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// addrStrings returns a node's /p2p addresses as strings.
func addrStrings(n *node.Node) []string {
	var out []string
	for _, a := range n.Addrs() {
		out = append(out, a.String())
	}
	return out
}

// waitFor is testkit.WaitFor that also checks cond at once on every change
// of any of the tables; it returns how long the wait took.
func waitFor(t testing.TB, within time.Duration, what string, cond func() error, tables ...*node.PeerTable) time.Duration {
	t.Helper()
	wake := make([]func() <-chan struct{}, len(tables))
	for i, tb := range tables {
		wake[i] = tb.Changed
	}
	return testkit.WaitFor(t, within, what, cond, wake...)
}

// knows reports why n's table does not hold other with the expected work
// types and labels (nil labels: not checked), or nil when it does.
func knows(n, other *node.Node, workTypes, labels []string) error {
	p, ok := n.Peers().Get(other.ID())
	if !ok {
		return fmt.Errorf("%s does not know %s", n.ID().ShortString(), other.ID().ShortString())
	}
	got := p.Data.WorkTypeNames()
	if !slices.Equal(got, workTypes) {
		return fmt.Errorf("%s sees %s with work types %v, want %v", n.ID().ShortString(), other.ID().ShortString(), got, workTypes)
	}
	if labels != nil && !slices.Equal(p.Data.Labels, labels) {
		return fmt.Errorf("%s sees %s with labels %v, want %v", n.ID().ShortString(), other.ID().ShortString(), p.Data.Labels, labels)
	}
	return nil
}

// newIdentity returns a fresh libp2p key and its peer ID.
func newIdentity(tb testing.TB) (crypto.PrivKey, peer.ID) {
	tb.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return key, id
}
