package node

import (
	"errors"
	"net/http"
	"reflect"
	"strings"

	"github.com/workmesh/workmesh/node/apiv1"
	"github.com/workmesh/workmesh/node/httpapi"
)

// InfoView is the body of GET /v1/info.
type InfoView = apiv1.InfoView

// InfoField is one field of GET /v1/info added with WithInfo.
type InfoField = apiv1.InfoField

// infoKeys are the JSON keys of InfoView's own fields, which WithInfo may
// not take.
var infoKeys = func() []string {
	var keys []string
	t := reflect.TypeFor[InfoView]()
	for i := range t.NumField() {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); k != "" && k != "-" {
			keys = append(keys, k)
		}
	}
	return keys
}()

// PeerView is one element of GET /v1/peers.
type PeerView = apiv1.PeerView

// NewPeerView returns the API form of a peer table entry.
func NewPeerView(p PeerInfo) PeerView {
	heads := make(map[string]uint64)
	for _, wt := range p.Data.WorkTypes {
		if wt.Head != nil {
			heads[wt.Name] = *wt.Head
		}
	}
	return PeerView{
		ID:             p.Data.PeerID.String(),
		Addrs:          nonNil(p.Data.Addrs),
		WorkTypes:      p.Data.WorkTypeNames(),
		Labels:         nonNil(p.Data.Labels),
		Heads:          heads,
		Capacity:       p.Data.Capacity,
		Load:           p.Data.Load,
		Version:        p.Data.Version,
		Sequence:       p.Data.Sequence,
		LastSeen:       p.LastSeen.UTC(),
		Connected:      p.Connected,
		Source:         p.Source.String(),
		AttestedLabels: attestedLabels(p),
		DeclaredLabels: declaredLabels(p),
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Info returns what GET /v1/info reports.
func (n *Node) Info() InfoView {
	cur := n.current()
	addrs := make([]string, 0)
	for _, a := range n.Addrs() {
		addrs = append(addrs, a.String())
	}
	v := InfoView{
		PeerID:    n.ID().String(),
		Addrs:     addrs,
		Network:   n.cfg.Network,
		Version:   n.records.version,
		WorkTypes: cur.Data.WorkTypeNames(),
		Labels:    nonNil(cur.Data.Labels),
	}
	for _, f := range n.info {
		v.Extra = append(v.Extra, InfoField{Key: f.key, Value: f.view()})
	}
	return v
}

// routes mounts the node's own views on the API.
func (n *Node) routes() error {
	info := n.api.Handle("GET /v1/info", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n.writeJSON(w, n.Info())
	}))
	peers := n.api.Handle("GET /v1/peers", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		peers := n.table.Peers()
		out := make([]PeerView, len(peers))
		for i, p := range peers {
			out[i] = NewPeerView(p)
		}
		n.writeJSON(w, out)
	}))
	return errors.Join(info, peers)
}

// HandleAPI mounts h on the local HTTP API under pattern (http.ServeMux
// syntax, e.g. "POST /v1/work"). It may be called at any time; a pattern that
// conflicts with one already mounted is an error.
func (n *Node) HandleAPI(pattern string, h http.Handler) error {
	return n.api.Handle(pattern, h)
}

// writeJSON answers 200 with v; a failed write is the client's going away.
func (n *Node) writeJSON(w http.ResponseWriter, v any) {
	if err := httpapi.WriteJSON(w, http.StatusOK, v); err != nil {
		n.log.Debugf("api: write response: %v", err)
	}
}
