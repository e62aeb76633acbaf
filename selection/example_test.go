package selection_test

import (
	"fmt"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/selection"
)

// A dispatcher's view of the core: full nodes first, archive nodes when the
// full group cannot serve, and the local worker when nothing remote can.
func Example() {
	cfg := config.Defaults()
	cfg.Worker.MaxRemoteWorkers = 3
	cfg.Worker.MaxRetries = 2
	include := true
	cfg.LabelBalancing = &config.LabelBalancingConfig{Order: []string{"full", "archive"}, IncludeDefault: &include}

	sel, err := selection.New(cfg, selection.WithSeed(7))
	if err != nil {
		panic(err)
	}
	sel.SetPeers([]selection.Peer{
		{ID: "full-1", Labels: []string{"full"}, Types: []selection.TypeInfo{{Name: "block", Head: 100, HasHead: true}}},
		{ID: "full-2", Labels: []string{"full"}, Types: []selection.TypeInfo{{Name: "block", Head: 100, HasHead: true}}},
		{ID: "archive-1", Labels: []string{"archive"}, Types: []selection.TypeInfo{{Name: "block", Head: 100, HasHead: true}}},
	})

	// Block 90: the full nodes miss it (empty at or below their head is a
	// miss), the archive node has it.
	plan := sel.Plan(selection.Request{WorkType: "block", MinHead: 90, HasMinHead: true})
	answers := map[string]selection.Outcome{"full-1": selection.Empty, "full-2": selection.Empty, "archive-1": selection.Success}
	for {
		pick, ok := plan.Next()
		if !ok {
			fmt.Println("no peer left:", plan.Explain())
			break
		}
		verdict := plan.Report(pick, answers[pick.Peer], 3*time.Millisecond)
		fmt.Printf("block 90 -> %s (group %s): %s, %s\n", pick.Peer, pick.Group, answers[pick.Peer], verdict)
		if verdict != selection.Retry {
			break
		}
	}

	// Block 101 is above every head: one attempt, its empty answer is final.
	plan = sel.Plan(selection.Request{WorkType: "block", MinHead: 101, HasMinHead: true})
	pick, _ := plan.Next()
	fmt.Printf("block 101 -> %s: %s; fallback allowed: %v\n", pick.Peer, plan.Report(pick, selection.Empty, time.Millisecond), plan.FallbackAllowed())

	// Both full nodes stop answering polls: they are skipped, and when
	// nothing remote is left the plan says why.
	for range cfg.Liveness.PollFailureThreshold {
		sel.Liveness().Report("full-1", false)
		sel.Liveness().Report("full-2", false)
		sel.Liveness().Report("archive-1", false)
	}
	plan = sel.Plan(selection.Request{WorkType: "block", MinHead: 90, HasMinHead: true})
	if _, ok := plan.Next(); !ok {
		fmt.Println("local fallback:", plan.Explain())
	}
	// Output:
	// block 90 -> full-1 (group full): empty, retry
	// block 90 -> full-2 (group full): empty, retry
	// block 90 -> archive-1 (group archive): success, done
	// block 101 -> full-1: done; fallback allowed: false
	// local fallback: 3 candidates for work type block: 3 unreachable
}
