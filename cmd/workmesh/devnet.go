package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
)

// Settings of the embedded network.
const (
	// devnetNetwork keeps the devnet apart from a real node on the same
	// machine: nodes of other networks are never seen.
	devnetNetwork = "devnet"
	// devnetListen is where every devnet node listens: loopback, a random
	// port.
	devnetListen = "/ip4/127.0.0.1/udp/0/quic-v1"
	// devnetMaxNodes bounds --nodes: every node is a full libp2p host.
	devnetMaxNodes = 32
	// devnetReadyTimeout bounds the wait for every node to see the others.
	devnetReadyTimeout = 30 * time.Second
	// devnetStopPath is the devnet's control endpoint on the gateway's API.
	devnetStopPath = "/v1/devnet/stop"
)

// devnetLabels is the label-balancing order every devnet node dispatches
// with: peers labelled full first, then archive, then the unlabelled.
var devnetLabels = []string{"full", "archive"}

// devnetRoles are the workers' labels and work types, dealt out in turn to
// nodes 1 to N-1; node 0, the gateway, serves every type and has no label.
var devnetRoles = []struct {
	labels []string
	types  []string
}{
	{[]string{"full"}, []string{"echo", "sha256", "sleep"}},
	{[]string{"archive"}, []string{"sha256", "sleep"}},
	{nil, []string{"echo", "sha256"}},
}

func newDevnetCommand() *cobra.Command {
	var o devnetOptions
	cmd := &cobra.Command{
		Use:   "devnet",
		Short: "Run an embedded workmesh network on loopback, for trying workmesh",
		Long: "devnet starts N nodes in this process on loopback QUIC, each with its own temporary data dir:\n" +
			"node0 is the gateway (every work type, the HTTP API at --api); the others are workers with mixed\n" +
			"labels (full, archive, none) and work types. Every node dispatches with label balancing\n" +
			"(full first, then archive, then unlabelled peers), up to 3 remote workers per request, and polls\n" +
			"its peers every 500ms. It prints the nodes, then \"ready\" once every node sees all the others,\n" +
			"and runs until SIGINT or SIGTERM.\n\n" +
			"Submit work with `workmesh submit --api ADDR`. To watch a failover, stop a worker with\n" +
			"  curl -X POST 'http://ADDR" + devnetStopPath + "?node=1'\n" +
			"--demo runs a scripted tour instead (sample work, a stopped worker, the failover) and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.nodes < 2 || o.nodes > devnetMaxNodes {
				return usageError{fmt.Errorf("--nodes %d: want 2 to %d", o.nodes, devnetMaxNodes)}
			}
			log, err := newLogger(o.logLevel, "text")
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			dn, err := startDevnet(ctx, o, log)
			if err != nil {
				return err
			}
			defer func() {
				fmt.Fprintln(out, "stopping the devnet")
				if err := dn.Close(); err != nil {
					log.WithError(err).Warn("devnet shutdown")
				}
			}()
			dn.printNodes(out)
			if err := dn.waitReady(ctx); err != nil {
				return err
			}
			fmt.Fprintln(out, "ready")
			if o.demo {
				return runDemo(ctx, dn, out)
			}
			api := dn.gateway().stack.Node().APIAddr()
			apiFlag := ""
			if api != config.Defaults().Node.API {
				apiFlag = " --api " + api
			}
			fmt.Fprintf(out, "submit work:    workmesh submit%s --type sha256 --payload hello\n", apiFlag)
			fmt.Fprintf(out, "stop a worker:  curl -X POST 'http://%s%s?node=1'\n", api, devnetStopPath)
			fmt.Fprintln(out, "Ctrl-C stops the devnet.")
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.nodes, "nodes", "n", 4, "number of nodes, the gateway included")
	f.StringVar(&o.api, "api", config.Defaults().Node.API, "host:port of the gateway's HTTP API (127.0.0.1:0 picks a free port)")
	f.BoolVar(&o.demo, "demo", false, "run the scripted tour and exit")
	f.StringVar(&o.logLevel, "log-level", "warn", "log level of the nodes: trace, debug, info, warn or error")
	return cmd
}

// devnetOptions are the flags of `workmesh devnet`.
type devnetOptions struct {
	nodes    int
	api      string
	demo     bool
	logLevel string
}

// devnetNode is one node of the devnet.
type devnetNode struct {
	name   string
	labels []string
	types  []string
	peerID string  // the peer ID as users see it
	pid    peer.ID // the same, as the selection core may key it
	stack  *stack  // nil once stopped
}

// devnet is an embedded network: N stacks in this process.
type devnet struct {
	log *logrus.Logger
	dir string // parent of every node's data dir; removed by Close

	mu    sync.Mutex // guards nodes[i].stack
	nodes []*devnetNode
}

// devnetConfig returns the config of one devnet node.
func devnetConfig(dataDir, api string, labels, types, bootstrap []string) (config.Config, error) {
	cfg := config.Defaults()
	cfg.Node.Network = devnetNetwork
	cfg.Node.Listen = []string{devnetListen}
	cfg.Node.DataDir = dataDir
	cfg.Node.API = api
	cfg.Node.Labels = labels
	cfg.Node.WorkTypes = types
	cfg.Node.Bootstrap = bootstrap
	// A failover is worth showing: another remote peer before the local
	// worker, a dead peer noticed within a couple of seconds.
	cfg.Worker.MaxRemoteWorkers = 3
	cfg.Worker.MaxRetries = 2
	cfg.Worker.ConnectTimeout = 500 * time.Millisecond
	cfg.Liveness.PollInterval = 500 * time.Millisecond
	cfg.Liveness.PollFailureThreshold = 3
	cfg.LabelBalancing = &config.LabelBalancingConfig{Order: slices.Clone(devnetLabels)}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("devnet config: %w", err)
	}
	return cfg, nil
}

// startDevnet starts the gateway, then the workers bootstrapped from it.
// On error everything started is stopped again.
func startDevnet(ctx context.Context, o devnetOptions, log *logrus.Logger) (*devnet, error) {
	dir, err := os.MkdirTemp("", "workmesh-devnet-")
	if err != nil {
		return nil, fmt.Errorf("devnet: data dir: %w", err)
	}
	dn := &devnet{log: log, dir: dir}
	fail := func(err error) (*devnet, error) {
		dn.Close()
		return nil, err
	}
	for i := range o.nodes {
		n := &devnetNode{name: "node" + strconv.Itoa(i)}
		api, opts := "", []stackOption(nil)
		var bootstrap []string
		if i == 0 {
			n.types = nil // every built-in type
			api = o.api
			opts = append(opts, withNodeOptions(node.WithAPIHandler("POST "+devnetStopPath, http.HandlerFunc(dn.serveStop))))
		} else {
			role := devnetRoles[(i-1)%len(devnetRoles)]
			n.labels, n.types = role.labels, role.types
			for _, a := range dn.nodes[0].stack.Node().Addrs() {
				bootstrap = append(bootstrap, a.String())
			}
		}
		cfg, err := devnetConfig(filepath.Join(dir, n.name), api, n.labels, n.types, bootstrap)
		if err != nil {
			return fail(err)
		}
		s, err := startStack(ctx, cfg, log, opts...)
		if err != nil {
			if i == 0 && errors.Is(err, syscall.EADDRINUSE) {
				return fail(usageError{fmt.Errorf("devnet: the API address %s is taken (another devnet or node running?); stop it or pick another with --api: %w", o.api, err)})
			}
			return fail(fmt.Errorf("devnet: start %s: %w", n.name, err))
		}
		n.stack, n.pid, n.peerID, n.types = s, s.Node().ID(), s.Node().ID().String(), s.Config().Node.WorkTypes
		dn.mu.Lock()
		dn.nodes = append(dn.nodes, n)
		dn.mu.Unlock()
	}
	return dn, nil
}

// gateway returns node 0, which serves the API.
func (dn *devnet) gateway() *devnetNode { return dn.nodes[0] }

// running returns the nodes that have not been stopped.
func (dn *devnet) running() []*devnetNode {
	dn.mu.Lock()
	defer dn.mu.Unlock()
	var out []*devnetNode
	for _, n := range dn.nodes {
		if n.stack != nil {
			out = append(out, n)
		}
	}
	return out
}

// name returns a peer's devnet name ("node2"), the gateway's for "local",
// and a short ID for a peer that is not in the devnet.
func (dn *devnet) name(id string) string {
	dn.mu.Lock()
	defer dn.mu.Unlock()
	if id == "local" {
		return dn.nodes[0].name + " (local)"
	}
	for _, n := range dn.nodes {
		if n.peerID == id || string(n.pid) == id {
			return n.name
		}
	}
	return shortPeer(id)
}

// printNodes prints the table of nodes.
func (dn *devnet) printNodes(w io.Writer) {
	fmt.Fprintf(w, "devnet: %d nodes on loopback, network %q, label-balancing order %s\n",
		len(dn.nodes), devnetNetwork, strings.Join(devnetLabels, ", "))
	fmt.Fprintf(w, "data: %s (removed on exit)\n", dn.dir)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPEER ID\tLABELS\tWORK TYPES\tROLE")
	for i, n := range dn.nodes {
		role := "worker"
		if i == 0 {
			role = "gateway, api " + n.stack.Node().APIAddr()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.name, n.peerID, dash(strings.Join(n.labels, ",")), strings.Join(n.types, ","), role)
	}
	tw.Flush()
	fmt.Fprintf(w, "api: %s\n", dn.gateway().stack.Node().APIAddr())
}

// waitReady waits until every running node has every other one in its
// peer table and the gateway's dispatcher has ranked them all alive.
func (dn *devnet) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, devnetReadyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		missing := dn.notReady()
		if missing == "" {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("devnet: not ready within %s: %s", devnetReadyTimeout, missing)
			}
			return ctx.Err()
		}
	}
}

// notReady says what is still missing, or "" when the devnet is ready.
func (dn *devnet) notReady() string {
	nodes := dn.running()
	for _, n := range nodes {
		if got := n.stack.Node().Peers().Len(); got < len(nodes)-1 {
			return fmt.Sprintf("%s sees %d of %d peers", n.name, got, len(nodes)-1)
		}
	}
	gw := dn.gateway().stack
	for _, t := range gw.Registry().Names() {
		want := 0
		for _, n := range nodes[1:] {
			if slices.Contains(n.types, t) {
				want++
			}
		}
		// Alive: a worker newly learned is selected once it answered a poll.
		got := 0
		for _, r := range gw.Dispatcher().Ranking(t) {
			if r.State == "alive" {
				got++
			}
		}
		if got < want {
			return fmt.Sprintf("the gateway ranks %d of %d workers alive for %s", got, want, t)
		}
	}
	return ""
}

// stop stops worker i (not the gateway) as if it had died.
func (dn *devnet) stop(i int) (*devnetNode, error) {
	dn.mu.Lock()
	if i < 1 || i >= len(dn.nodes) {
		dn.mu.Unlock()
		return nil, fmt.Errorf("node %d: want a worker, 1 to %d (node0 is the gateway)", i, len(dn.nodes)-1)
	}
	n := dn.nodes[i]
	s := n.stack
	n.stack = nil
	dn.mu.Unlock()
	if s == nil {
		return n, fmt.Errorf("%s is already stopped", n.name)
	}
	return n, s.CloseWithin(shutdownTimeout)
}

// serveStop is POST /v1/devnet/stop?node=N (or ?peer=ID): it stops a
// worker so that failover can be watched.
func (dn *devnet) serveStop(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	q := r.URL.Query()
	i := -1
	switch {
	case q.Get("node") != "":
		n, err := strconv.Atoi(q.Get("node"))
		if err != nil {
			reply(http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("node %q: want a number", q.Get("node"))})
			return
		}
		i = n
	case q.Get("peer") != "":
		dn.mu.Lock()
		i = slices.IndexFunc(dn.nodes, func(n *devnetNode) bool { return n.peerID == q.Get("peer") })
		dn.mu.Unlock()
		if i < 0 {
			reply(http.StatusNotFound, map[string]string{"error": "peer " + q.Get("peer") + ": not a devnet node"})
			return
		}
	default:
		reply(http.StatusBadRequest, map[string]string{"error": "want ?node=N or ?peer=ID"})
		return
	}
	n, err := dn.stop(i)
	if err != nil {
		reply(http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	dn.log.WithFields(logrus.Fields{"node": n.name, "peer": n.peerID}).Warn("devnet: worker stopped")
	reply(http.StatusOK, map[string]string{"stopped": n.name, "peer": n.peerID})
}

// Close stops every node that is still running, at once, and removes the
// data dirs.
func (dn *devnet) Close() error {
	dn.mu.Lock()
	var stacks []*stack
	for _, n := range dn.nodes {
		if n.stack != nil {
			stacks = append(stacks, n.stack)
			n.stack = nil
		}
	}
	dn.mu.Unlock()
	errs := make([]error, len(stacks))
	var wg sync.WaitGroup
	for i, s := range stacks {
		wg.Go(func() { errs[i] = s.CloseWithin(shutdownTimeout) })
	}
	wg.Wait()
	if err := os.RemoveAll(dn.dir); err != nil {
		errs = append(errs, fmt.Errorf("devnet: remove %s: %w", dn.dir, err))
	}
	return errors.Join(errs...)
}

// nodeOf returns the index of the devnet node with peer ID id, or -1.
func (dn *devnet) nodeOf(id string) int {
	dn.mu.Lock()
	defer dn.mu.Unlock()
	return slices.IndexFunc(dn.nodes, func(n *devnetNode) bool { return n.peerID == id })
}
