package node

import (
	"bytes"
	"fmt"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/selection"
)

// Source says how a record reached the peer table.
type Source int

// The ways a record reaches the peer table.
const (
	// SourceGossip: a gossipsub announcement, published by the node itself
	// or passed on by another.
	SourceGossip Source = iota + 1
	// SourceDHT: a value record read from the DHT.
	SourceDHT
	// SourceSync: a record handed over by a peer on the nodedata protocol.
	SourceSync
)

// String names the source.
func (s Source) String() string {
	switch s {
	case SourceGossip:
		return "gossip"
	case SourceDHT:
		return "dht"
	case SourceSync:
		return "sync"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// numSources sizes the per-source rejection counters; index 0 counts the
// rejections whose source was not said.
const numSources = int(SourceSync) + 1

// PeerInfo is what the peer table knows of one peer. Values handed out are
// copies of an immutable entry: callers must not modify the slices inside.
type PeerInfo struct {
	// Data is the newest verified record of the peer.
	Data NodeData
	// Envelope is the signed form of Data, which may be passed on.
	Envelope []byte
	// LastSeen is when the table last received a newer record of the peer.
	LastSeen time.Time
	// Source is how the newest record arrived.
	Source Source
	// Connected reports whether the host has a connection to the peer.
	Connected bool
	// Gossiped reports whether this record (this sequence) has been seen
	// on gossip, i.e. has already been relayed through the mesh by this
	// node, or published by this node on the peer's behalf. A record first
	// learned by sync or from the DHT is still relayed once when its gossip
	// copy arrives, so that learning it early never stops it from
	// spreading.
	Gossiped bool
	// Cert is the peer's membership certificate, verified when the
	// record arrived, in a table with Members; nil otherwise.
	Cert *authority.Certificate
}

// PeerTableConfig configures a peer table.
type PeerTableConfig struct {
	// Self is this node; its own records are never entered.
	Self peer.ID
	// Network is the network records must belong to.
	Network string
	// TTL is how long a record stays fresh without a newer one.
	TTL time.Duration
	// Clock tells the time the table judges freshness by, so tests can
	// move time without sleeping; nil means the real clock.
	Clock selection.Clock
	// Logger receives one debug line per rejected (reason, sender); nil
	// means the standard logrus logger.
	Logger *logrus.Logger
	// Cap bounds the peers the table holds (0: no bound). When it is full,
	// a record of a new peer is refused (RejectTableFull), unless the host
	// is connected to that peer: it then takes the place of the
	// longest-unheard peer the host is not connected to. A connected peer
	// is never evicted.
	Cap int
	// Members, when set, makes the network a closed one: a record is
	// entered only when its peer is a member (RejectNotMember
	// otherwise), and a peer stops counting (fresh) once its certificate
	// expires or is revoked.
	Members *Members
}

// tombstoneFactor sets how long the sequence of an expired peer is
// remembered, in TTLs, so that a copy of its last record relayed by another
// peer cannot bring it back.
const tombstoneFactor = 10

// maxLoggedRejects bounds the set of (reason, sender) pairs already logged.
const maxLoggedRejects = 4096

// tableState is an immutable copy of the table; readers of the whole table
// load it without locking.
type tableState struct {
	byID map[peer.ID]*PeerInfo
}

type rejectKey struct {
	reason RejectReason
	from   peer.ID
}

type tombstone struct {
	seq   uint64
	until time.Time
}

// PeerTable holds the newest verified NodeData of every known peer, merged
// from gossip, the DHT and peer sync. A newer sequence replaces an older one,
// a record is only ever accepted from its own signer, and a peer whose record
// has not been refreshed within the TTL is no longer fresh. Reads are a
// single lookup or, for the whole table, a snapshot taken once per change.
type PeerTable struct {
	self    peer.ID
	network string
	ttl     time.Duration
	clock   selection.Clock
	log     *logrus.Logger
	cap     int
	members *Members
	// nextCertExpiry is the earliest certificate expiry of the entries, in
	// Unix nanoseconds (0: none); see memberLoop.
	nextCertExpiry atomic.Int64

	// snap is a copy of byID for readers of the whole table, made by the
	// first such reader after a change (nil until then): a burst of records
	// costs one copy, not one per record.
	snap    atomic.Pointer[tableState]
	rejects [len(rejectNames)]atomic.Uint64
	// rejectsBy counts the same rejections by source, then reason.
	rejectsBy [numSources][len(rejectNames)]atomic.Uint64

	// additions counts the peers entered into the table (a peer expired
	// and entered again counts again); see Additions.
	additions atomic.Uint64

	mu sync.Mutex // guards what follows
	// byID holds every record not yet expired. An entry is never changed
	// in place: an edit replaces it, so a snapshot may share entries.
	byID       map[peer.ID]*PeerInfo
	connected  map[peer.ID]bool
	tombstones map[peer.ID]tombstone
	logged     map[rejectKey]bool
	changed    chan struct{}
}

// NewPeerTable returns an empty peer table.
func NewPeerTable(cfg PeerTableConfig) *PeerTable {
	if cfg.Clock == nil {
		cfg.Clock = selection.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.StandardLogger()
	}
	t := &PeerTable{
		self:       cfg.Self,
		network:    cfg.Network,
		ttl:        cfg.TTL,
		clock:      cfg.Clock,
		log:        cfg.Logger,
		cap:        cfg.Cap,
		members:    cfg.Members,
		byID:       make(map[peer.ID]*PeerInfo),
		connected:  make(map[peer.ID]bool),
		tombstones: make(map[peer.ID]tombstone),
		logged:     make(map[rejectKey]bool),
		changed:    make(chan struct{}),
	}
	return t
}

// view returns the snapshot of the table, making it when the table changed
// since the last one.
func (t *PeerTable) view() *tableState {
	if st := t.snap.Load(); st != nil {
		return st
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.snap.Load(); st != nil {
		return st
	}
	st := &tableState{byID: maps.Clone(t.byID)}
	t.snap.Store(st)
	return st
}

// entry returns the record held of id, fresh or not.
func (t *PeerTable) entry(id peer.ID) (*PeerInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	return e, ok
}

// Submit opens a signed record and offers it to the table. from is the peer
// that delivered it (for logging; relaying is allowed because the record's
// own signature is what counts). It reports whether the table changed; a
// refused record is counted and its error returned.
func (t *PeerTable) Submit(data []byte, from peer.ID, src Source) (bool, error) {
	sd, err := OpenNodeData(data, t.network)
	if err != nil {
		t.RejectVia(src, ReasonOf(err), from, err)
		return false, err
	}
	return t.Offer(sd, from, src)
}

// Offer enters a verified record when it is newer than the one held. An older
// sequence is counted as a replay and refused; the same sequence again is a
// harmless duplicate and only reports false.
func (t *PeerTable) Offer(sd *SignedNodeData, from peer.ID, src Source) (bool, error) {
	id := sd.Data.PeerID
	if id == t.self {
		return false, nil
	}
	if sd.Data.Network != t.network {
		err := reject(RejectWrongNetwork, fmt.Errorf("network %q, want %q", sd.Data.Network, t.network))
		t.RejectVia(src, RejectWrongNetwork, from, err)
		return false, err
	}
	now := t.clock.Now()
	var cert *authority.Certificate
	if t.members != nil {
		held, _ := t.entry(id)
		var err error
		if cert, err = t.members.admit(&sd.Data, held, now); err != nil {
			err = reject(RejectNotMember, err)
			t.RejectVia(src, RejectNotMember, from, err)
			return false, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	floor, have := uint64(0), false
	if old, ok := t.byID[id]; ok {
		floor, have = old.Data.Sequence, true
	} else if ts, ok := t.tombstones[id]; ok && now.Before(ts.until) {
		floor, have = ts.seq, true
	}
	if have && sd.Data.Sequence <= floor {
		if sd.Data.Sequence == floor {
			if old, ok := t.byID[id]; ok && src == SourceGossip && !old.Gossiped {
				t.replaceLocked(id, func(e *PeerInfo) { e.Gossiped = true })
			}
			return false, nil
		}
		err := reject(RejectReplay, fmt.Errorf("sequence %d of %s, already have %d", sd.Data.Sequence, id, floor))
		t.rejectLocked(src, RejectReplay, from, err)
		return false, err
	}
	if _, ok := t.byID[id]; !ok {
		if t.cap > 0 && len(t.byID) >= t.cap && !t.evictForLocked(id, now) {
			err := reject(RejectTableFull, fmt.Errorf("record of %s: the table holds %d peers (peer-table-cap) and the node is not connected to it", id, len(t.byID)))
			t.rejectLocked(src, RejectTableFull, from, err)
			return false, err
		}
		t.additions.Add(1)
	}
	delete(t.tombstones, id)
	t.byID[id] = &PeerInfo{
		Data:      sd.Data,
		Envelope:  sd.Envelope,
		LastSeen:  now,
		Source:    src,
		Connected: t.connected[id],
		Gossiped:  src == SourceGossip,
		Cert:      cert,
	}
	t.noteCertLocked(cert)
	t.publishLocked()
	return true, nil
}

// evictForLocked makes room for a record of id in a full table: when the
// host is connected to id, the longest-unheard entry of a peer it is not
// connected to is removed (remembered as expired ones are). It reports
// whether there is room.
func (t *PeerTable) evictForLocked(id peer.ID, now time.Time) bool {
	if !t.connected[id] {
		return false
	}
	var victim *PeerInfo
	for _, e := range t.byID {
		if !e.Connected && (victim == nil || e.LastSeen.Before(victim.LastSeen)) {
			victim = e
		}
	}
	if victim == nil {
		return false
	}
	vid := victim.Data.PeerID
	t.tombstones[vid] = tombstone{seq: victim.Data.Sequence, until: now.Add(tombstoneFactor * t.ttl)}
	delete(t.byID, vid)
	t.log.WithField("peer", vid.String()).Debug("peer evicted: the table is full and a connected peer needs its place")
	return true
}

// Cap returns the most peers the table holds (0: no bound).
func (t *PeerTable) Cap() int { return t.cap }

// Sequence returns the highest sequence the table holds, or still remembers
// after expiry, for id. A record of id is only entered above it.
func (t *PeerTable) Sequence(id peer.ID) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[id]; ok {
		return old.Data.Sequence, true
	}
	if ts, ok := t.tombstones[id]; ok && t.clock.Now().Before(ts.until) {
		return ts.seq, true
	}
	return 0, false
}

// Holds reports whether the table holds exactly this envelope for id: a
// copy of it changes nothing, so it needs no signature check.
func (t *PeerTable) Holds(id peer.ID, envelope []byte) bool {
	old, ok := t.entry(id)
	return ok && bytes.Equal(old.Envelope, envelope)
}

// HoldsGossiped reports whether the table holds exactly this envelope for id
// and has already seen it on gossip, so that another gossip copy can be
// dropped without checking its signature again.
func (t *PeerTable) HoldsGossiped(id peer.ID, envelope []byte) bool {
	old, ok := t.entry(id)
	return ok && old.Gossiped && bytes.Equal(old.Envelope, envelope)
}

// Reject counts a refused record and logs it at debug, once per reason and
// sender.
func (t *PeerTable) Reject(reason RejectReason, from peer.ID, err error) {
	t.RejectVia(0, reason, from, err)
}

// RejectVia is Reject for a record that arrived by src (gossip, the DHT or
// sync), so that rejections can be told apart by where they came from.
func (t *PeerTable) RejectVia(src Source, reason RejectReason, from peer.ID, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rejectLocked(src, reason, from, err)
}

func (t *PeerTable) rejectLocked(src Source, reason RejectReason, from peer.ID, err error) {
	if reason <= 0 || int(reason) >= len(t.rejects) {
		reason = RejectMalformed
	}
	if src < 0 || int(src) >= numSources {
		src = 0
	}
	t.rejects[reason].Add(1)
	t.rejectsBy[src][reason].Add(1)
	k := rejectKey{reason, from}
	if t.logged[k] {
		return
	}
	if len(t.logged) >= maxLoggedRejects {
		clear(t.logged)
	}
	t.logged[k] = true
	t.log.WithFields(logrus.Fields{"reason": reason.String(), "from": from.String()}).
		Debugf("nodedata rejected: %v (further rejections for this reason from this peer are only counted)", err)
}

// Rejections returns how many records were refused, by reason.
func (t *PeerTable) Rejections() map[RejectReason]uint64 {
	out := make(map[RejectReason]uint64, len(t.rejects))
	for _, r := range RejectReasons() {
		out[r] = t.rejects[r].Load()
	}
	return out
}

// SetConnected records whether the host is connected to id.
func (t *PeerTable) SetConnected(id peer.ID, connected bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if connected {
		t.connected[id] = true
	} else {
		delete(t.connected, id)
	}
	if old, ok := t.byID[id]; ok && old.Connected != connected {
		t.replaceLocked(id, func(e *PeerInfo) { e.Connected = connected })
	}
}

// replaceLocked replaces the entry of id (which must exist) by a copy
// changed by edit.
func (t *PeerTable) replaceLocked(id peer.ID, edit func(*PeerInfo)) {
	e := *t.byID[id]
	edit(&e)
	t.byID[id] = &e
	t.publishLocked()
}

// IsConnected reports whether the host is connected to id, record or not.
func (t *PeerTable) IsConnected(id peer.ID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.connected[id]
}

// Heard notes that id answered a health ping naming seq as its current
// record's sequence. When that is the record held, the peer has just
// vouched for it again: the entry stays fresh for another TTL, as if the
// record had been re-announced (records are re-announced on change and
// rarely otherwise). To bound the table changes this makes (every poll of
// every peer), an entry is renewed only once half its TTL has passed. It
// reports whether seq is newer than the record held (or none is held), so
// that the caller may fetch it: an announcement this node missed.
func (t *PeerTable) Heard(id peer.ID, seq uint64) (newer bool) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	switch {
	case !ok || seq > e.Data.Sequence:
		return true
	case seq == e.Data.Sequence && now.Sub(e.LastSeen) >= t.ttl/2 && t.member(e, now):
		t.replaceLocked(id, func(e *PeerInfo) { e.LastSeen = now })
	}
	return false
}

// fresh reports whether e is within its TTL at now.
func (t *PeerTable) fresh(e *PeerInfo, now time.Time) bool {
	return now.Sub(e.LastSeen) < t.ttl && t.member(e, now)
}

// Get returns the fresh record of id.
func (t *PeerTable) Get(id peer.ID) (PeerInfo, bool) {
	e, ok := t.entry(id)
	if !ok || !t.fresh(e, t.clock.Now()) {
		return PeerInfo{}, false
	}
	return *e, true
}

// Peers returns every fresh peer, ordered by peer ID.
func (t *PeerTable) Peers() []PeerInfo {
	return t.filter(func(*PeerInfo) bool { return true })
}

// Entries returns the fresh peers' entries, in no order, without copying
// them: the entries are the table's own and must not be modified. An entry
// is never changed in place (a new record or connection state replaces
// it), so a caller that keeps the pointers of an earlier call learns which
// peers changed since by comparing them.
func (t *PeerTable) Entries() []*PeerInfo {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*PeerInfo, 0, len(t.byID))
	for _, e := range t.byID {
		if t.fresh(e, now) {
			out = append(out, e)
		}
	}
	return out
}

// Eligible returns the fresh peers that serve workType and carry every one
// of labels (none means any), ordered by peer ID. Self is never among them.
func (t *PeerTable) Eligible(workType string, labels []string) []PeerInfo {
	return t.filter(func(e *PeerInfo) bool {
		return e.Data.Serves(workType) && hasLabels(e.GroupLabels(), labels)
	})
}

func (t *PeerTable) filter(keep func(*PeerInfo) bool) []PeerInfo {
	st := t.view()
	now := t.clock.Now()
	out := make([]PeerInfo, 0, len(st.byID))
	for _, e := range st.byID {
		if t.fresh(e, now) && keep(e) {
			out = append(out, *e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Data.PeerID < out[j].Data.PeerID })
	return out
}

// Len returns the number of fresh peers.
func (t *PeerTable) Len() int {
	st := t.view()
	now := t.clock.Now()
	n := 0
	for _, e := range st.byID {
		if t.fresh(e, now) {
			n++
		}
	}
	return n
}

// Expire removes the peers whose record is past its TTL and returns how many
// it removed. Reads already leave stale peers out; Expire frees them and
// remembers their last sequence so a relayed copy cannot revive them.
func (t *PeerTable) Expire() int {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, ts := range t.tombstones {
		if !now.Before(ts.until) {
			delete(t.tombstones, id)
		}
	}
	var gone []peer.ID
	for id, e := range t.byID {
		if !t.fresh(e, now) {
			gone = append(gone, id)
		}
	}
	if t.members != nil {
		defer t.recomputeCertExpiryLocked()
	}
	if len(gone) == 0 {
		return 0
	}
	for _, id := range gone {
		t.tombstones[id] = tombstone{seq: t.byID[id].Data.Sequence, until: now.Add(tombstoneFactor * t.ttl)}
		delete(t.byID, id)
		t.log.WithField("peer", id.String()).Debug("peer expired: no newer nodedata within the record TTL, or no longer a member")
	}
	t.publishLocked()
	return len(gone)
}

// Additions returns how many times a peer has entered the table (a peer
// that expired and came back counts twice). A reader that noted it before
// reading the table learns, by comparing, whether a new peer arrived since,
// without reading the table again.
func (t *PeerTable) Additions() uint64 {
	return t.additions.Load()
}

// Changed returns a channel that is closed at the next change of the table
// (a record entered or expired, a connection state changed).
func (t *PeerTable) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// publishLocked tells readers the table changed: the snapshot is made again
// by the next reader, and Changed's channel is closed.
func (t *PeerTable) publishLocked() {
	t.snap.Store(nil)
	close(t.changed)
	t.changed = make(chan struct{})
}
