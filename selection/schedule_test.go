package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/tests/testkit"
)

// dueByScan is the poll schedule's rule read off every peer, as a scan: the
// oracle the heaps of schedule.go must agree with.
func dueByScan(l *Liveness) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	alive := 0
	for _, h := range l.peers {
		if h.load() == StateAlive {
			alive++
		}
	}
	aliveEvery := l.cfg.PollInterval
	if b := l.cfg.PollBudget; b > 0 && alive > b {
		aliveEvery = time.Duration(float64(l.cfg.PollInterval) * float64(alive) / float64(b))
	}
	var out []string
	for id, h := range l.peers {
		switch st := h.load(); st {
		case StateUnreachable:
			if !now.Before(h.nextAttempt) {
				out = append(out, id)
			}
		default:
			every := l.pollInterval(h)
			if st == StateAlive {
				every = aliveEvery
			}
			if l.cfg.PollInterval > 0 && !now.Before(h.lastPoll.Add(every)) {
				out = append(out, id)
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestSchedule_AgreesWithAScan drives liveness through random polls,
// attempts, stalls, answers, disputes, forced states, peers coming and
// going and time passing, and checks after every step that the due polls
// the schedule reads are exactly the ones a scan of every peer finds.
func TestSchedule_AgreesWithAScan(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			clk := testkit.NewFakeClock()
			cfg := config.LivenessConfig{
				PollInterval:         time.Second,
				PollFailureThreshold: 3,
				PollSuccessThreshold: 2,
				PollBudget:           4,
				RedialBackoffMin:     300 * time.Millisecond,
				RedialBackoffMax:     4 * time.Second,
				StallThreshold:       2,
				StallCordon:          2 * time.Second,
			}
			if seed%5 == 4 {
				cfg.PollInterval, cfg.PollSuccessThreshold = 0, 0
			}
			l, err := NewLiveness(cfg, clk)
			if err != nil {
				t.Fatal(err)
			}
			l.SetTrust(config.TrustConfig{DisputeThreshold: 2, DisputeWindow: time.Minute, DisputeCordon: 3 * time.Second})
			if seed%2 == 1 {
				l.AwaitFirstPoll()
			}
			ids := make([]string, 12)
			for i := range ids {
				ids[i] = fmt.Sprintf("p%02d", i)
			}
			known := map[string]struct{}{}
			for step := range 3000 {
				id := ids[rng.IntN(len(ids))]
				op := rng.IntN(12)
				switch op {
				case 0:
					known[id] = struct{}{}
					l.handles([]string{id})
				case 1:
					delete(known, id)
					l.retain(known)
				case 2, 3:
					for _, p := range l.DuePolls() {
						l.ReportPoll(p, rng.IntN(4) > 0)
					}
				case 4:
					l.Report(id, rng.IntN(2) == 0)
				case 5:
					l.ReportStall(id)
				case 6:
					l.ReportAnswer(id)
				case 7:
					l.ReportDispute(id)
				case 8:
					if _, ok := known[id]; ok {
						_ = l.setState(id, State(rng.IntN(int(numStates))))
					}
				default:
					clk.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
				}
				if got, want := l.Due(), dueByScan(l); !slices.Equal(got, want) {
					t.Fatalf("step %d (op %d on %s): schedule says due %v, a scan finds %v", step, op, id, got, want)
				}
			}
		})
	}
}
