package dispatch

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

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
	sreq := selection.Request{WorkType: req.Type, Labels: req.Labels, Idempotent: d.catalog.Idempotent(req.Type, nil)}
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

	// The counts come from the core, before anything is picked, so that a
	// selectable peer reads as selectable rather than as already tried.
	x := plan.Explain()
	v.Candidates = x.Candidates
	parts := make([]string, 0, len(x.Counts))
	for _, c := range x.Counts {
		pc := apiv1.PlanCount{Reason: c.Reason.String(), Detail: c.Detail, N: c.N, Text: c.String()}
		if c.Reason == selection.ReasonLimit {
			pc = apiv1.PlanCount{Reason: "selectable", N: c.N, Text: fmt.Sprintf("%d selectable", c.N)}
		}
		v.Counts = append(v.Counts, pc)
		parts = append(parts, pc.Text)
	}
	if x.Candidates == 0 && len(x.Counts) == 0 {
		v.Explanation = x.String()
	} else {
		noun := "candidates"
		if x.Candidates == 1 {
			noun = "candidate"
		}
		v.Explanation = fmt.Sprintf("%d %s for work type %s: %s", x.Candidates, noun, req.Type, strings.Join(parts, ", "))
	}

	// The order a request would walk: every pick is handed back at once.
	for range d.cfg.Worker.MaxRemoteWorkers + d.cfg.Worker.MaxRetries + 1 {
		pk, ok := plan.Next()
		if !ok {
			break
		}
		plan.Report(pk, selection.Cancelled, 0)
		v.Order = append(v.Order, apiv1.PlanPick{Peer: peer.ID(pk.Peer).String(), Group: pk.Group, Score: pk.Score, Rated: pk.Rated})
	}

	v.Groups, v.Excluded = d.planGroups(sreq, lb, plan.BeyondHead())
	local := d.pool != nil
	if local {
		_, local = d.pool.Registry().Get(req.Type)
	}
	switch {
	case !plan.FallbackAllowed():
		v.FallbackNote = "beyond every head the one remote answer is final"
	case !local:
		v.FallbackNote = "the local worker does not serve " + req.Type
	default:
		v.Fallback = true
	}
	return v
}

// planGroups lays out the ranking of the request's work type by group and
// says why each excluded candidate is excluded. The stages are those of the
// selection core's plan, in its order: label constraints, head, liveness;
// candidates outside every group come from the peer table.
func (d *Dispatcher) planGroups(req selection.Request, lb *config.LabelBalancingConfig, beyondHead bool) ([]apiv1.PlanGroup, []apiv1.PlanExcluded) {
	ranking := d.sel.Ranking(req.WorkType)
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
	for _, r := range ranking {
		gi := slices.IndexFunc(groups, func(g apiv1.PlanGroup) bool { return g.Label == r.Group })
		if gi < 0 {
			continue // a group that changed under the snapshot
		}
		id := peer.ID(r.Peer).String()
		pp := apiv1.PlanPeer{Peer: id, Score: r.Score, Rated: r.Rated, State: r.State.String()}
		pp.Excluded, pp.Detail = d.excludedBy(req, r, beyondHead)
		groups[gi].Peers = append(groups[gi].Peers, pp)
		if !seen[r.Peer] {
			seen[r.Peer] = true
			if pp.Excluded != "" {
				excluded = append(excluded, apiv1.PlanExcluded{Peer: id, Reason: pp.Excluded, Detail: pp.Detail})
			}
		}
	}
	if lb != nil && !lb.IncludesDefault() {
		for _, pi := range d.node.Peers().Peers() {
			if seen[string(pi.Data.PeerID)] || !pi.Data.Serves(req.WorkType) {
				continue
			}
			if !slices.ContainsFunc(lb.Order, func(l string) bool { return slices.Contains(pi.Data.Labels, l) }) {
				excluded = append(excluded, apiv1.PlanExcluded{Peer: pi.Data.PeerID.String(), Reason: selection.ReasonNotInGroup.String()})
			}
		}
	}
	return groups, excluded
}

// excludedBy says why the request may not try a ranked peer, or "".
func (d *Dispatcher) excludedBy(req selection.Request, r selection.Ranked, beyondHead bool) (string, string) {
	pi, ok := d.node.Peers().Get(peer.ID(r.Peer))
	if ok {
		for _, l := range req.Labels {
			if !slices.Contains(pi.Data.Labels, l) {
				return selection.ReasonLacksLabel.String(), l
			}
		}
		if h, has := pi.Data.Head(req.WorkType); req.HasMinHead && !beyondHead && has && h < req.MinHead {
			return selection.ReasonHeadBelow.String(), strconv.FormatUint(req.MinHead, 10)
		}
	}
	switch r.State {
	case selection.StateUnreachable:
		return selection.ReasonUnreachable.String(), ""
	case selection.StateProbing:
		return selection.ReasonProbing.String(), ""
	}
	return "", ""
}
