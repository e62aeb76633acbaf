package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/workmesh/workmesh/node/httpapi"
)

// InfoView is the body of GET /v1/info: who this node is and how to reach it.
type InfoView struct {
	PeerID    string   `json:"peer_id"`    // the node's peer ID
	Addrs     []string `json:"addrs"`      // listen addresses with /p2p/<peer id>, ready to bootstrap from
	Network   string   `json:"network"`    // the network it joined
	Version   string   `json:"version"`    // the workmesh version it runs
	WorkTypes []string `json:"work_types"` // the work types it advertises
	Labels    []string `json:"labels"`     // its group labels
	// Extra holds the fields added with WithInfo, in the order they were
	// added. Each is written after the fields above under its key; one
	// whose value is nil is left out.
	Extra []InfoField `json:"-"`
}

// InfoField is one field of GET /v1/info added with WithInfo.
type InfoField struct {
	Key   string // the JSON key
	Value any    // what the WithInfo function returned for this request
}

// MarshalJSON writes the fields of v and then its Extra fields, as if each
// were one more field of the struct.
func (v InfoView) MarshalJSON() ([]byte, error) {
	type fields InfoView // the struct's fields, without this method
	b, err := json.Marshal(fields(v))
	if err != nil || len(v.Extra) == 0 {
		return b, err
	}
	b = b[:len(b)-1] // reopen the object
	for _, f := range v.Extra {
		if f.Value == nil {
			continue
		}
		val, err := json.Marshal(f.Value)
		if err != nil {
			return nil, fmt.Errorf("info %s: %w", f.Key, err)
		}
		key, _ := json.Marshal(f.Key)
		b = append(append(append(append(b, ','), key...), ':'), val...)
	}
	return append(b, '}'), nil
}

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

// PeerView is one element of GET /v1/peers: one fresh peer of the table.
type PeerView struct {
	ID        string            `json:"id"`         // peer ID
	Addrs     []string          `json:"addrs"`      // listen addresses the peer signed, without /p2p
	WorkTypes []string          `json:"work_types"` // work types it serves
	Labels    []string          `json:"labels"`     // its group labels
	Heads     map[string]uint64 `json:"heads"`      // head per work type, for types that have one
	Capacity  Capacity          `json:"capacity"`   // how much work it takes at most
	Load      Load              `json:"load"`       // its load when it signed the record
	Version   string            `json:"version"`    // the workmesh version it runs
	Sequence  uint64            `json:"sequence"`   // sequence of its newest record
	LastSeen  time.Time         `json:"last_seen"`  // when a newer record last arrived
	Connected bool              `json:"connected"`  // whether this node has a connection to it
	Source    string            `json:"source"`     // how the newest record arrived: gossip, dht or sync
}

// NewPeerView returns the API form of a peer table entry.
func NewPeerView(p PeerInfo) PeerView {
	heads := make(map[string]uint64)
	for _, wt := range p.Data.WorkTypes {
		if wt.Head != nil {
			heads[wt.Name] = *wt.Head
		}
	}
	return PeerView{
		ID:        p.Data.PeerID.String(),
		Addrs:     nonNil(p.Data.Addrs),
		WorkTypes: p.Data.WorkTypeNames(),
		Labels:    nonNil(p.Data.Labels),
		Heads:     heads,
		Capacity:  p.Data.Capacity,
		Load:      p.Data.Load,
		Version:   p.Data.Version,
		Sequence:  p.Data.Sequence,
		LastSeen:  p.LastSeen.UTC(),
		Connected: p.Connected,
		Source:    p.Source.String(),
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
