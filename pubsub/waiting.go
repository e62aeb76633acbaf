package pubsub

import (
	"sync"
	"sync/atomic"
	"time"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// inspectors runs gossipsub RPC inspectors in turn; the first error drops
// the RPC.
func inspectors(fs ...func(peer.ID, *lpubsub.RPC) error) func(peer.ID, *lpubsub.RPC) error {
	return func(p peer.ID, rpc *lpubsub.RPC) error {
		for _, f := range fs {
			if err := f(p, rpc); err != nil {
				return err
			}
		}
		return nil
	}
}

// waiting is the set of announcements waiting in gossipsub's validation
// queue, by message ID, so that the copies arriving meanwhile are cut
// before they take a place of their own there. Gossipsub drops a copy on
// arrival only once a validation worker has taken the first one from the
// queue (and marked it seen); until then, every copy (from each mesh peer,
// and while a network forms from every peer that floods it) was queued
// behind it, and on a loaded node the queue filled with copies and
// dropped records (of 200 nodes forming on mocknet, 200-5,000 messages).
//
// A message is entered when its first copy arrives, and leaves when
// gossipsub takes it for validation, drops it as a duplicate, or rejects
// it. Gossipsub ignores the RPCs of a graylisted peer after this inspector
// has seen them, so a message entered from one is never taken: it leaves
// after waitingHold, and the peer that entered it enters nothing for
// suspectFor. A graylisted peer can thus hold the copies of a message out
// of the queue for waitingHold, once per suspectFor.
type waiting struct {
	mu      sync.Mutex
	at      map[string]waitingEntry
	swept   time.Time
	suspect map[peer.ID]time.Time // enters nothing until
	cut     atomic.Uint64
}

type waitingEntry struct {
	from peer.ID
	at   time.Time
}

// waitingHold bounds how long a message stays in the set; suspectFor is
// how long a peer whose entry outstayed it enters nothing; maxWaiting
// bounds the set and the suspects (beyond it, copies are not cut until
// entries leave).
const (
	waitingHold = 2 * time.Second
	suspectFor  = time.Minute
	maxWaiting  = 4096
)

func newWaiting() *waiting {
	return &waiting{at: make(map[string]waitingEntry), suspect: make(map[peer.ID]time.Time)}
}

// inspect is the RPC inspector that cuts the copies of waiting messages of
// topic from an RPC. It runs on gossipsub's event loop.
func (w *waiting) inspect(topic string) func(peer.ID, *lpubsub.RPC) error {
	return func(from peer.ID, rpc *lpubsub.RPC) error {
		pub := rpc.GetPublish()
		if len(pub) == 0 {
			return nil
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		enters := !now.Before(w.suspect[from])
		kept := pub[:0]
		for _, m := range pub {
			if m.GetTopic() != topic || w.enterLocked(MessageID(m.GetData()), from, now, enters) {
				kept = append(kept, m)
				continue
			}
			w.cut.Add(1)
		}
		rpc.Publish = kept
		return nil
	}
}

// enterLocked reports false when a copy of id is waiting already, and
// otherwise true, entering it when enter is set.
func (w *waiting) enterLocked(id string, from peer.ID, now time.Time, enter bool) bool {
	if e, ok := w.at[id]; ok {
		if now.Sub(e.at) < waitingHold {
			return false
		}
		w.outstayedLocked(id, e, now)
	}
	if !enter {
		return true
	}
	if len(w.at) >= maxWaiting {
		if now.Sub(w.swept) < waitingHold {
			return true // full of fresh entries: not cut, not entered
		}
		w.swept = now
		for k, e := range w.at {
			if now.Sub(e.at) >= waitingHold {
				w.outstayedLocked(k, e, now)
			}
		}
		if len(w.at) >= maxWaiting {
			return true
		}
	}
	w.at[id] = waitingEntry{from: from, at: now}
	return true
}

// outstayedLocked takes out an entry gossipsub never took, and makes the
// peer that entered it a suspect.
func (w *waiting) outstayedLocked(id string, e waitingEntry, now time.Time) {
	delete(w.at, id)
	if len(w.suspect) >= maxWaiting {
		for p, until := range w.suspect {
			if !now.Before(until) {
				delete(w.suspect, p)
			}
		}
		if len(w.suspect) >= maxWaiting {
			return
		}
	}
	w.suspect[e.from] = now.Add(suspectFor)
}

// release takes m out of the set: gossipsub took it, dropped it or
// rejected it.
func (w *waiting) release(m *lpubsub.Message) {
	id := m.ID
	if id == "" {
		id = MessageID(m.GetData())
	}
	w.mu.Lock()
	delete(w.at, id)
	w.mu.Unlock()
}

// CopiesCut returns how many copies of announcements waiting for
// validation were dropped on arrival (see waiting).
func (a *Announcer) CopiesCut() uint64 { return a.waiting.cut.Load() }
