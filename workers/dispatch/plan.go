package dispatch

import (
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/selection"
)

// Plan works out where a request would go now, without sending it: the
// groups in order with their members in rated order, the peers it would
// try, every excluded candidate with its reason, and the counts by reason.
// The picks it takes from the selection core are reported back as
// cancelled, so nothing stays counted in flight.
func (d *Dispatcher) Plan(req apiv1.PlanRequest) apiv1.PlanView {
	// The view has no payload: a jsonrpc request shows as not hedged.
	sreq := selection.Request{WorkType: req.Type, Labels: req.Labels, Idempotent: d.catalog.Idempotent(req.Type, nil), View: true}
	if req.MinHead != nil {
		sreq.MinHead, sreq.HasMinHead = *req.MinHead, true
	}
	plan := d.sel.Plan(sreq)
	v := apiv1.PlanView{
		WorkType: req.Type, Labels: req.Labels, MinHead: req.MinHead,
		Mode: d.cfg.Selection.Mode, BeyondHead: plan.BeyondHead(),
		Groups: []apiv1.PlanGroup{}, Order: []apiv1.PlanPick{}, Excluded: []apiv1.PlanExcluded{}, Counts: []apiv1.PlanCount{},
		Limits: apiv1.PlanLimits{MaxRemoteWorkers: d.cfg.Worker.MaxRemoteWorkers, MaxRetries: d.cfg.Worker.MaxRetries, HedgeMaxCount: d.cfg.Hedge.MaxCount},
	}
	hd, _, measured := d.sel.HedgeDelay(req.Type)
	v.Limits.HedgeDelayMS, v.Limits.HedgeDelayMeasured = apiv1.Millis(hd), measured
	if v.Labels == nil {
		v.Labels = []string{}
	}
	if v.Mode == "" {
		v.Mode = config.ModeRating
	}
	lb := d.cfg.LabelBalancingFor(req.Type)
	if lb != nil {
		v.LabelOrder, v.PassOnError, v.IncludeDefault = lb.Order, lb.PassOnError, lb.IncludesDefault()
	}

	// The records are taken before anything is picked, so that a selectable
	// peer reads as selectable rather than as already tried.
	cands := plan.Candidates()
	x := selection.Tally(req.Type, cands)
	v.Candidates = x.Candidates
	for _, c := range x.Counts {
		v.Counts = append(v.Counts, apiv1.PlanCount{Reason: c.Reason.String(), Detail: c.Detail, N: c.N, Text: c.String()})
	}
	v.Explanation = x.String()

	// The order a request would walk: every pick is handed back at once.
	for range d.cfg.Worker.MaxRemoteWorkers + d.cfg.Worker.MaxRetries + 1 {
		pk, ok := plan.Next()
		if !ok {
			break
		}
		plan.Report(pk, selection.Cancelled, 0)
		v.Order = append(v.Order, apiv1.PlanPick{Peer: peer.ID(pk.Peer).String(), Group: pk.Group, Score: pk.Score, Rated: pk.Rated})
	}

	v.Groups, v.Excluded = planGroups(lb, cands)
	localWhy := d.localRefusal(req.Type, req.Labels)
	switch {
	case d.headRefusal(req.Type, req.MinHead, plan) != "":
		// Nothing would be sent: the request is refused as a whole.
		v.Order, v.FallbackNote = []apiv1.PlanPick{}, "the request is refused: "+d.headRefusal(req.Type, req.MinHead, plan)
	case !plan.FallbackAllowed():
		v.FallbackNote = "beyond every head the one remote answer is final"
	case localWhy != "":
		v.FallbackNote = localWhy
	default:
		v.Fallback = true
	}
	return v
}

// planGroups lays out the core's records by group, in its order, and lists
// every candidate the request may not try once, with the core's reason.
func planGroups(lb *config.LabelBalancingConfig, cands []selection.Candidate) ([]apiv1.PlanGroup, []apiv1.PlanExcluded) {
	var groups []apiv1.PlanGroup
	if lb == nil {
		groups = []apiv1.PlanGroup{{Peers: []apiv1.PlanPeer{}}}
	} else {
		for _, l := range lb.Order {
			groups = append(groups, apiv1.PlanGroup{Label: l, Peers: []apiv1.PlanPeer{}})
		}
		if lb.IncludesDefault() {
			groups = append(groups, apiv1.PlanGroup{Default: true, Peers: []apiv1.PlanPeer{}})
		}
	}
	excluded := []apiv1.PlanExcluded{}
	seen := map[string]bool{}
	for _, c := range cands {
		id := peer.ID(c.Peer).String()
		var why, detail string
		if c.Reason != selection.ReasonSelectable {
			why, detail = c.Reason.String(), c.Detail
		}
		if gi := c.GroupIndex; gi >= 0 && gi < len(groups) && groups[gi].Label == c.Group {
			groups[gi].Peers = append(groups[gi].Peers, apiv1.PlanPeer{Peer: id, Score: c.Score, Rated: c.Rated, State: c.State.String(), Excluded: why, Detail: detail})
		}
		if !seen[c.Peer] {
			seen[c.Peer] = true
			if why != "" {
				excluded = append(excluded, apiv1.PlanExcluded{Peer: id, Reason: why, Detail: detail})
			}
		}
	}
	return groups, excluded
}
