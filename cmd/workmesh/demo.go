package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
)

// demoEjectTimeout bounds the wait for the gateway's liveness to mark the
// stopped worker unreachable (three failed polls 500ms apart, plus slack).
const demoEjectTimeout = 10 * time.Second

// demo is the scripted tour of `workmesh devnet --demo`: it submits work to
// the gateway's API exactly as `workmesh submit` does and prints what a
// user would see, with peer IDs replaced by node names.
type demo struct {
	dn  *devnet
	w   io.Writer
	api string
}

// runDemo runs the tour on a ready devnet.
func runDemo(ctx context.Context, dn *devnet, w io.Writer) error {
	d := &demo{dn: dn, w: w, api: dn.gateway().stack.Node().APIAddr()}
	d.section("1. Sample work. node0 takes it on its API and sends it to the best remote worker: label\n" +
		"   balancing puts peers labelled full first, then archive, then the unlabelled, and rating orders\n" +
		"   each group.")
	d.ranking("sha256")
	served, err := d.submit(ctx, "sha256", "hello", 0)
	if err != nil {
		return err
	}
	for _, s := range []struct {
		workType, payload string
		timeout           time.Duration
	}{
		{"echo", "hello, workmesh", 0},
		{"sleep", "300ms", 2 * time.Second},
	} {
		if _, err := d.submit(ctx, s.workType, s.payload, s.timeout); err != nil {
			return err
		}
	}

	d.section("2. Work that cannot succeed ends with one clear result and its exit code.")
	if _, err := d.submit(ctx, "sleep", "5s", 500*time.Millisecond); err != nil {
		return err
	}
	if _, err := d.submit(ctx, "nosuch", "x", 0); err != nil {
		return err
	}

	victim := dn.nodeOf(served.Worker)
	if victim < 1 {
		return fmt.Errorf("demo: sha256 was served by %s, not by a worker; nothing to stop", dn.name(served.Worker))
	}
	name := dn.nodes[victim].name
	d.section(fmt.Sprintf("3. Failover. Stop %s, the worker that served sha256, and submit again: node0 still\n"+
		"   has its record and tries it first; the attempt fails and node0 goes on to the next group.", name))
	fmt.Fprintf(w, "$ curl -X POST 'http://%s%s?node=%d'\n", d.api, devnetStopPath, victim)
	stopped := time.Now()
	n, err := dn.stop(victim)
	if err != nil {
		return fmt.Errorf("demo: stop %s: %w", name, err)
	}
	fmt.Fprintf(w, "stopped %s (%s)\n", n.name, n.peerID)
	if _, err := d.submit(ctx, "sha256", "hello", 0); err != nil {
		return err
	}

	d.section(fmt.Sprintf("4. Liveness. node0 polls its peers every 500ms; three failures eject %s, and work no\n"+
		"   longer tries it.", name))
	if err := d.waitEjected(ctx, n, stopped); err != nil {
		return err
	}
	d.ranking("sha256")
	if _, err := d.submit(ctx, "sha256", "hello", 0); err != nil {
		return err
	}
	d.section("Done. `workmesh devnet` runs the same network until Ctrl-C; `workmesh submit --help` for more.")
	return nil
}

func (d *demo) section(title string) {
	fmt.Fprintf(d.w, "\n%s\n", title)
}

// submit posts one request as `workmesh submit --output text` would and
// prints the command, the result and the summary line.
func (d *demo) submit(ctx context.Context, workType, payload string, timeout time.Duration) (apiv1.WorkResponse, error) {
	line := "$ workmesh submit"
	if d.api != config.Defaults().Node.API {
		line += " --api " + d.api
	}
	line += fmt.Sprintf(" --type %s --payload %q", workType, payload)
	if timeout > 0 {
		line += " --timeout " + timeout.String()
	}
	fmt.Fprintln(d.w, line)
	req := apiv1.WorkRequest{Type: workType, Payload: &payload}
	if timeout > 0 {
		req.Timeout = timeout.String()
	}
	ans, err := postWork(ctx, d.api, req, timeout)
	if err != nil {
		return apiv1.WorkResponse{}, fmt.Errorf("demo: submit %s: %w", workType, err)
	}
	r := ans.resp
	if r.Status == apiv1.StatusOK {
		if err := writeResult(d.w, r); err != nil {
			return r, err
		}
	}
	fmt.Fprintf(d.w, "  %s\n", summarize(r, d.dn.name))
	if err := outcomeError(workType, r); err != nil {
		var ee exitError
		errors.As(err, &ee)
		fmt.Fprintf(d.w, "  workmesh: %v\n  (exit code %d)\n", err, ee.code)
	}
	return r, nil
}

// ranking prints the gateway's current order for a work type.
func (d *demo) ranking(workType string) {
	var parts []string
	for _, r := range d.dn.gateway().stack.Dispatcher().Ranking(workType) {
		g := r.Group
		if g == "" {
			g = "unlabelled"
		}
		s := fmt.Sprintf("%s [%s, %s]", d.dn.name(r.Peer), g, r.State)
		parts = append(parts, s)
	}
	fmt.Fprintf(d.w, "node0's order for %s: %s\n", workType, strings.Join(parts, " > "))
}

// waitEjected waits until the gateway's liveness marks n unreachable, as
// its ranking for sha256 shows, and says how long it took.
func (d *demo) waitEjected(ctx context.Context, n *devnetNode, since time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, demoEjectTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		state := "alive"
		for _, r := range d.dn.gateway().stack.Dispatcher().Ranking("sha256") {
			if d.dn.name(r.Peer) == n.name {
				state = r.State
			}
		}
		if state == "unreachable" {
			fmt.Fprintf(d.w, "liveness: node0 marked %s %s, %s after it stopped\n",
				n.name, state, time.Since(since).Round(10*time.Millisecond))
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("demo: %s still %s %s after it stopped: %w",
				n.name, state, time.Since(since).Round(time.Millisecond), ctx.Err())
		}
	}
}
