package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
)

// The internet-scale table: what the design costs a node per second in a
// network of 1,000, 10,000 and 100,000 nodes, worked out from the
// per-message costs make bench measured (BenchmarkPerMessageCosts,
// BenchmarkRecordPublishRate) and the shipped settings. It is arithmetic on
// measured figures, not a measurement of such a network.

// internetSizes are the network sizes of the table.
var internetSizes = []int{1_000, 10_000, 100_000}

// Assumptions of the table that no setting fixes.
const (
	// chainBlock is how often the chain of a node that serves one (the
	// jsonrpc type) has a new head: its record is published again then.
	chainBlock = 12 * time.Second
	// dispatchingShare is the share of the nodes that dispatch work and so
	// poll every worker they know.
	dispatchingShare = 0.01
	// gossipIDBytes is the size of one message ID in an IHAVE: the
	// SHA-256 of the message, 32 bytes, plus its protobuf framing.
	gossipIDBytes = 34
)

// costs are the per-message inputs, from one make bench run.
type costs struct {
	validateUS, membersValidateUS float64 // CPU to validate one gossiped record
	gossipBytes                   float64 // one record as one gossip message
	pingCPUUS                     float64 // one health ping and answer, both ends
	pingBytes, answerBytes        float64
	publishLoad                   float64 // a node's own publications per second under load
}

// internetCosts reads the inputs from results; missing names those not run.
func internetCosts(results map[string]map[string]float64) (c costs, missing []string) {
	get := func(bench, metric string) float64 {
		v, ok := results[bench][metric]
		if !ok {
			missing = append(missing, bench+" "+metric)
		}
		return v
	}
	const pm = "BenchmarkPerMessageCosts/"
	c.validateUS = get(pm+"gossip-validate", "µs/record")
	c.membersValidateUS = get(pm+"members-validate", "µs/record")
	c.gossipBytes = get(pm+"gossip-validate", "gossip-msg-bytes")
	c.pingCPUUS = get(pm+"health-ping", "ping-cpu-µs")
	c.pingBytes = get(pm+"health-ping", "ping-bytes")
	c.answerBytes = get(pm+"health-ping", "answer-bytes")
	c.publishLoad = get("BenchmarkRecordPublishRate", "publish/s-load")
	return c, missing
}

// writeInternetTable writes the table as markdown.
func writeInternetTable(w io.Writer, c costs) {
	d := config.Defaults()
	gp := lpubsub.DefaultGossipSubParams()
	announce := d.Node.AnnounceInterval
	poll := d.Liveness.PollInterval
	capPeers := d.Node.PeerTableCap

	type line struct {
		what string
		f    func(n float64) string
	}
	// Records a node receives per second: every node's refresh, its own
	// publications under load, and (second scenario) a new chain head.
	idleRecords := func(n float64) float64 { return n * (1/announce.Seconds() + c.publishLoad) }
	chainRecords := func(n float64) float64 { return n * (1/announce.Seconds() + c.publishLoad + 1/chainBlock.Seconds()) }
	// Bytes in: each record from about D mesh peers, and its ID in an
	// IHAVE from up to Dlazy others at each heartbeat.
	gossipIn := func(records float64) float64 {
		return records * (float64(gp.D)*c.gossipBytes + float64(gp.Dlazy)*gossipIDBytes)
	}
	workers := func(n float64) float64 { return n * (1 - dispatchingShare) }
	// A dispatcher polls at most poll-budget alive workers per
	// poll-interval; beyond that each worker is polled less often.
	budget := float64(d.Liveness.PollBudget)
	polled := func(n float64) float64 {
		if budget > 0 {
			return min(workers(n), budget)
		}
		return workers(n)
	}
	pingsSent := func(n float64) float64 { return polled(n) / poll.Seconds() }
	lines := []line{
		{"records received, no chain heads (refresh every " + announce.String() + ", publications under load)", func(n float64) string { return num(idleRecords(n)) }},
		{"records received, every node serving a chain with a new head every " + chainBlock.String(), func(n float64) string { return num(chainRecords(n)) }},
		{"signature checks (one per record: gossip messages carry no signature of their own)", func(n float64) string {
			return num(idleRecords(n)) + " / " + num(chainRecords(n))
		}},
		{"validation CPU, open network / with an authority (chain heads)", func(n float64) string {
			return cores(chainRecords(n)*c.validateUS) + " / " + cores(chainRecords(n)*c.membersValidateUS)
		}},
		{"gossip bytes received (no heads / chain heads)", func(n float64) string {
			return bytesPS(gossipIn(idleRecords(n))) + " / " + bytesPS(gossipIn(chainRecords(n)))
		}},
		{fmt.Sprintf("a dispatcher: health pings sent (every worker every %s, at most poll-budget %d per %s)", poll, d.Liveness.PollBudget, poll), func(n float64) string { return num(pingsSent(n)) }},
		{"a dispatcher: time between two polls of one alive worker", func(n float64) string {
			return (time.Duration(float64(poll) * workers(n) / polled(n))).Round(time.Second).String()
		}},
		{"a dispatcher: health ping CPU (both ends' cost, as an upper bound of one)", func(n float64) string {
			return cores(pingsSent(n) * c.pingCPUUS)
		}},
		{"a dispatcher: health ping bytes (out + in)", func(n float64) string {
			return bytesPS(pingsSent(n) * (c.pingBytes + c.answerBytes))
		}},
		{fmt.Sprintf("a dispatcher: connections its polls need (connection manager keeps %d-%d)", node.ConnLowWater, node.ConnHighWater), func(n float64) string { return num(workers(n)) }},
		{fmt.Sprintf("a worker: health pings received (%.0f%% of the nodes dispatching)", dispatchingShare*100), func(n float64) string {
			return num(n * dispatchingShare * polled(n) / workers(n) / poll.Seconds())
		}},
		{fmt.Sprintf("peer table entries (peer-table-cap %d)", capPeers), func(n float64) string { return num(n) }},
	}
	fmt.Fprintf(w, "| per node per second | %s |\n|---|%s\n", strings.Join(mapSizes(func(n int) string { return fmt.Sprintf("%d nodes", n) }), " | "),
		strings.Repeat("---|", len(internetSizes)))
	for _, l := range lines {
		fmt.Fprintf(w, "| %s | %s |\n", l.what, strings.Join(mapSizes(func(n int) string { return l.f(float64(n)) }), " | "))
	}
	fmt.Fprintf(w, "\nInputs, from this run: validating a record %.1f µs (%.1f µs with an authority), a record as a gossip message %.0f bytes, "+
		"a health ping %.1f µs of CPU (both ends) and %.0f + %.0f bytes, %.3f own publications per second under load; "+
		"gossipsub D=%d, Dlazy=%d; announce-interval %s, poll-interval %s.\n",
		c.validateUS, c.membersValidateUS, c.gossipBytes, c.pingCPUUS, c.pingBytes, c.answerBytes, c.publishLoad, gp.D, gp.Dlazy, announce, poll)
	fmt.Fprintf(w, "\nWhere it breaks first: %s\n", breaksFirst(workers, capPeers, d.Liveness.PollBudget))
}

// breaksFirst names the first limit a growing network meets.
func breaksFirst(workers func(float64) float64, capPeers, budget int) string {
	// The smallest network at which a dispatcher polls more workers than
	// its connection manager keeps connections.
	conn := float64(node.ConnHighWater) / (1 - dispatchingShare)
	return fmt.Sprintf("a dispatcher polls every worker it knows, over a connection each, and the connection manager trims beyond %d: "+
		"from about %.0f nodes on, the polls of the trimmed peers dial again (a cold connect each; the dispatcher protects only the connections to the workers that lead its ranking). "+
		"poll-budget (%d) bounds the polls, not the dials: past it a worker is polled less often, so a worker that died unseen is found by a request's attempt sooner than by a poll. "+
		"Next, at %d nodes the peer table is full (peer-table-cap), and records of further peers are refused unless connected. "+
		"Gossip itself grows with the records published: without chain heads a node receives a record per node per %s; "+
		"with a chain head in every record, a 100,000-node network sends each node thousands of records a second, and the bytes (each from about D mesh peers) are what breaks there.",
		node.ConnHighWater, conn, budget, capPeers, config.Defaults().Node.AnnounceInterval)
}

func mapSizes(f func(int) string) []string {
	out := make([]string, len(internetSizes))
	for i, n := range internetSizes {
		out[i] = f(n)
	}
	return out
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// cores turns µs of CPU per second into cores.
func cores(usPerSecond float64) string { return fmt.Sprintf("%.3f cores", usPerSecond/1e6) }

func bytesPS(b float64) string {
	switch {
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB/s", b/1e6)
	case b >= 1e3:
		return fmt.Sprintf("%.1f kB/s", b/1e3)
	default:
		return fmt.Sprintf("%.0f B/s", b)
	}
}
