package pubsub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/workmesh/workmesh/tests/testkit"
)

func newHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/udp/0/quic-v1"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func quiet() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

type delivery struct {
	from  peer.ID
	value any
}

func acceptAll(_ peer.ID, data []byte) (any, error) { return string(data), nil }

// judge accepts "good..." messages, ignores "old..." and rejects the rest.
func judge(_ peer.ID, data []byte) (any, error) {
	s := string(data)
	switch {
	case strings.HasPrefix(s, "good"):
		return s, nil
	case strings.HasPrefix(s, "old"):
		return nil, ErrIgnore
	}
	return nil, errors.New("bad announcement")
}

func TestTopicName(t *testing.T) {
	if got := TopicName("prod"); got != "workmesh/prod/nodedata/1" {
		t.Errorf("TopicName = %q", got)
	}
}

func TestNewChecksArguments(t *testing.T) {
	h := newHost(t)
	if _, err := New(context.Background(), h, "", acceptAll, nil); err == nil {
		t.Error("empty network accepted")
	}
	if _, err := New(context.Background(), h, "n", nil, nil); err == nil {
		t.Error("nil verifier accepted")
	}
	if _, err := New(context.Background(), h, "n", acceptAll, nil, WithLogger(nil)); err == nil {
		t.Error("nil logger accepted")
	}
}

// TestOnlyVerifiedAnnouncementsAreDelivered publishes a rejected, an ignored
// and an accepted message; only the accepted one reaches the handler, with
// the peer that passed it on.
func TestOnlyVerifiedAnnouncementsAreDelivered(t *testing.T) {
	ctx := context.Background()
	ha, hb := newHost(t), newHost(t)
	joined := make(chan peer.ID, 1)
	a, err := New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()),
		WithPeerJoin(func(p peer.ID, _ bool) { joined <- p }))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := make(chan delivery, 10)
	b, err := New(ctx, hb, "test", judge, func(from peer.ID, v any) { got <- delivery{from, v} }, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	if err := hb.Connect(ctx, peer.AddrInfo{ID: ha.ID(), Addrs: ha.Addrs()}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-joined:
		if p != hb.ID() {
			t.Fatalf("join of %s, want %s", p, hb.ID())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no peer join")
	}
	for _, msg := range []string{"forged", "old copy", "good one"} {
		if err := a.Publish(ctx, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case d := <-got:
		if d.value != "good one" || d.from != ha.ID() {
			t.Errorf("delivered %q from %s, want \"good one\" from %s", d.value, d.from, ha.ID())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing delivered")
	}
	select {
	case d := <-got:
		t.Errorf("also delivered %q", d.value)
	case <-time.After(50 * time.Millisecond):
	}
	if n := len(b.Peers()); n != 1 {
		t.Errorf("B sees %d topic peers, want 1", n)
	}
}

// TestGreetingOnJoinArrives publishes from inside the join function. The
// join function runs only once the peer is subscribed and our stream to it
// is open; a greeting sent on the subscription alone can be dropped by
// gossipsub, so this runs several fresh pairs.
func TestGreetingOnJoinArrives(t *testing.T) {
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		ha, hb := newHost(t), newHost(t)
		var a *Announcer
		var once sync.Once
		ready := make(chan struct{})
		var err error
		a, err = New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()), WithPeerJoin(func(peer.ID, bool) {
			<-ready
			once.Do(func() {
				if err := a.Publish(ctx, []byte("good hello")); err != nil {
					t.Error(err)
				}
			})
		}))
		if err != nil {
			t.Fatal(err)
		}
		close(ready)
		got := make(chan any, 1)
		b, err := New(ctx, hb, "test", judge, func(_ peer.ID, v any) { got <- v }, WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		if err := ha.Connect(ctx, peer.AddrInfo{ID: hb.ID(), Addrs: hb.Addrs()}); err != nil {
			t.Fatal(err)
		}
		select {
		case v := <-got:
			if v != "good hello" {
				t.Errorf("pair %d: got %q", i, v)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("pair %d: the greeting published on join never arrived", i)
		}
		a.Close()
		b.Close()
	}
}

func TestCloseStopsDelivery(t *testing.T) {
	h := newHost(t)
	a, err := New(context.Background(), h, "test", acceptAll, func(peer.ID, any) {}, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { a.Close(); a.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs")
	}
}

// TestMessageIDsAreContentAddressed: the same bytes published by two peers
// are one gossip message. C hears A's copy first; B's copy, published after
// that, is a duplicate to C and never reaches C's verifier, while a
// different message B publishes next does. Messages carry no author and no
// signature of gossipsub's own.
func TestMessageIDsAreContentAddressed(t *testing.T) {
	ctx := context.Background()
	x, sameX := []byte("x"), []byte(strings.Clone("x"))
	if MessageID(x) != MessageID(sameX) || MessageID(x) == MessageID([]byte("y")) {
		t.Fatal("MessageID is not a function of the bytes alone")
	}
	ha, hb, hc := newHost(t), newHost(t), newHost(t)
	joins := func(ch chan peer.ID) Option { return WithPeerJoin(func(p peer.ID, _ bool) { ch <- p }) }
	joinedA, joinedB := make(chan peer.ID, 4), make(chan peer.ID, 4)
	a, err := New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()), joins(joinedA))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(ctx, hb, "test", acceptAll, nil, WithLogger(quiet()), joins(joinedB))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var mu sync.Mutex
	checked := map[string]int{}
	got := make(chan delivery, 10)
	c, err := New(ctx, hc, "test", func(from peer.ID, data []byte) (any, error) {
		mu.Lock()
		checked[string(data)]++
		mu.Unlock()
		return string(data), nil
	}, func(from peer.ID, v any) { got <- delivery{from, v} }, WithLogger(quiet()),
		// One validation worker: C checks what it receives in the order
		// it arrives (see "good next" below).
		WithGossipSubOptions(lpubsub.WithValidateWorkers(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, h := range []host.Host{ha, hb} {
		if err := hc.Connect(ctx, peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range []chan peer.ID{joinedA, joinedB} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("no peer join")
		}
	}
	await := func(want string) delivery {
		t.Helper()
		for {
			select {
			case d := <-got:
				if d.value == want {
					return d
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%q never delivered", want)
			}
		}
	}
	if err := a.Publish(ctx, []byte("good record")); err != nil {
		t.Fatal(err)
	}
	if d := await("good record"); d.from != ha.ID() {
		t.Errorf("first copy from %s, want A %s", d.from, ha.ID())
	}
	if err := b.Publish(ctx, []byte("good record")); err != nil {
		t.Fatal(err)
	}
	// B's stream to C carries its messages in order, and C validates them
	// in that order: once "good next" is delivered, B's copy of the record
	// has been handled.
	if err := b.Publish(ctx, []byte("good next")); err != nil {
		t.Fatal(err)
	}
	await("good next")
	mu.Lock()
	defer mu.Unlock()
	if n := checked["good record"]; n != 1 {
		t.Errorf("the record published by A and by B was verified %d times at C, want 1", n)
	}
}

// TestSendQueueBeforeIdentify: a peer whose subscription arrives before
// this node has identified it gets a send queue at once (earlyQueues). B
// does not answer identify, so A never identifies B, the event on which
// gossipsub alone would make A's queue to B: A still opens its stream to B
// once B subscribed, and B receives what A publishes.
func TestSendQueueBeforeIdentify(t *testing.T) {
	ctx := context.Background()
	ha, hb := newHost(t), newHost(t)
	hb.RemoveStreamHandler(identify.ID)
	a, err := New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := make(chan any, 1)
	b, err := New(ctx, hb, "test", acceptAll, func(_ peer.ID, v any) { got <- v }, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := hb.Connect(ctx, peer.AddrInfo{ID: ha.ID(), Addrs: ha.Addrs()}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "A's gossip stream to B, which subscribed but does not answer identify, and B's subscription at A", func() error {
		if !a.HasStream(hb.ID()) {
			_, dropped := a.Dropped()
			return fmt.Errorf("no stream yet (%d messages dropped)", dropped)
		}
		if !slices.Contains(a.Peers(), hb.ID()) {
			return errors.New("B's subscription not at A yet")
		}
		return nil
	})
	if err := a.Publish(ctx, []byte("good after subscribe")); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v != "good after subscribe" {
			t.Errorf("got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B never received A's announcement")
	}
}

// TestQueuelessPeerIsSentNoForwards: F forwards A's announcements while
// S, subscribed to F, has no send queue at F (S does not answer identify,
// and F makes no early queues): F does not take S for a floodsub peer and
// forwards it nothing, so nothing is dropped; S is no mesh peer of F's.
func TestQueuelessPeerIsSentNoForwards(t *testing.T) {
	ctx := context.Background()
	ha, hf, hs := newHost(t), newHost(t), newHost(t)
	hs.RemoveStreamHandler(identify.ID)
	a, err := New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := make(chan any, 64)
	f, err := New(ctx, hf, "test", acceptAll, func(_ peer.ID, v any) { got <- v }, WithLogger(quiet()),
		func(o *options) error { o.noEarly = true; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := New(ctx, hs, "test", acceptAll, nil, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, h := range []host.Host{ha, hs} {
		if err := h.Connect(ctx, peer.AddrInfo{ID: hf.ID(), Addrs: hf.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	// F learns of S's subscription (a topic event) though it has no
	// queue for S: gossipsub's own list of topic peers leaves S out.
	joined := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.peers[hs.ID()].joined
	}
	testkit.WaitFor(t, 10*time.Second, "F counts S in the topic, and A and F have streams to each other", func() error {
		if !joined() || !a.HasStream(hf.ID()) || !f.HasStream(ha.ID()) {
			return fmt.Errorf("S joined at F %v; A has a stream to F %v, F to A %v", joined(), a.HasStream(hf.ID()), f.HasStream(ha.ID()))
		}
		return nil
	})
	if f.HasStream(hs.ID()) {
		t.Fatal("F has a stream to S: the test proves nothing")
	}
	const n = 21
	for i := range n {
		if err := a.Publish(ctx, fmt.Appendf(nil, "good %d", i)); err != nil {
			t.Fatal(err)
		}
		// The next is published once F has this one: F's event loop
		// forwarded each before it took the next (the last is not
		// waited for: its forward, were there one, may come after).
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("F never received announcement %d", i)
		}
	}
	if all := f.DroppedNoStream(); all != 0 {
		t.Errorf("F dropped %d of %d forwards to S, which has no send queue there: want none sent", all, n)
	}
}

// TestSubscriptionFilter: only the network's topic is tracked, and a
// subscription to it from a peer without a stream queues the peer for an
// early send queue.
func TestSubscriptionFilter(t *testing.T) {
	a := &Announcer{peers: map[peer.ID]peerState{}, early: make(chan peer.ID, 1)}
	f := newEarlyQueues(a, []string{"t"})
	if !f.CanSubscribe("t") || f.CanSubscribe("other") {
		t.Error("CanSubscribe: want the network's topic only")
	}
	yes, no := true, false
	other, topic := "other", "t"
	subs := []*pb.RPC_SubOpts{{Topicid: &other, Subscribe: &yes}, {Topicid: &topic, Subscribe: &yes}}
	kept, err := f.FilterIncomingSubscriptions("p1", subs)
	if err != nil || len(kept) != 1 || kept[0].GetTopicid() != "t" {
		t.Fatalf("kept %v, %v; want the subscription to t only", kept, err)
	}
	select {
	case p := <-a.early:
		if p != "p1" {
			t.Errorf("early queue for %s, want p1", p)
		}
	default:
		t.Error("a peer subscribing without a stream was not queued for an early send queue")
	}
	a.peers["p2"] = peerState{outbound: true}
	unsub := []*pb.RPC_SubOpts{{Topicid: &topic, Subscribe: &no}}
	if _, err := f.FilterIncomingSubscriptions("p1", unsub); err != nil {
		t.Fatal(err)
	}
	if _, err := f.FilterIncomingSubscriptions("p2", subs); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-a.early:
		t.Errorf("queued %s: neither an unsubscription nor a peer with a stream needs an early queue", p)
	default:
	}
}

// TestCopiesOfWaitingMessagesAreCut: while a message waits for validation,
// its copies are cut from the RPCs that bring them, not those of another
// topic; once gossipsub took it (or dropped it), copies pass again. A
// message gossipsub never takes (it ignored the RPC of a graylisted peer)
// holds copies out for waitingHold only, and its peer then enters nothing.
func TestCopiesOfWaitingMessagesAreCut(t *testing.T) {
	w := newWaiting()
	inspect := w.inspect("t")
	topic, other := "t", "other"
	msg := func(topic, data string) *pb.Message { return &pb.Message{Topic: &topic, Data: []byte(data)} }
	send := func(from peer.ID, ms ...*pb.Message) string {
		rpc := &lpubsub.RPC{}
		rpc.Publish = ms
		if err := inspect(from, rpc); err != nil {
			t.Fatal(err)
		}
		var kept []string
		for _, m := range rpc.GetPublish() {
			kept = append(kept, string(m.GetData()))
		}
		return strings.Join(kept, ",")
	}
	if got := send("p1", msg(topic, "a"), msg(topic, "a"), msg(topic, "b")); got != "a,b" {
		t.Fatalf("first RPC kept %q, want a,b (the second a is a copy)", got)
	}
	if got := send("p2", msg(topic, "a"), msg(other, "a")); got != "a" {
		t.Fatalf("a copy of a waiting message passed, or another topic's was cut: kept %q", got)
	}
	if w.cut.Load() != 2 {
		t.Errorf("cut %d copies, want 2", w.cut.Load())
	}
	w.release(&lpubsub.Message{Message: msg(topic, "a")})
	if got := send("p2", msg(topic, "a")); got != "a" {
		t.Fatalf("a copy after its message left the queue was cut: kept %q", got)
	}
	// "b" is never taken (its RPC was ignored): once waitingHold has
	// passed, its copy goes through, and p1 enters nothing for a while.
	w.mu.Lock()
	e := w.at[MessageID([]byte("b"))]
	e.at = e.at.Add(-waitingHold)
	w.at[MessageID([]byte("b"))] = e
	w.mu.Unlock()
	if got := send("p2", msg(topic, "b")); got != "b" {
		t.Fatalf("a message never taken held its copies out past waitingHold: kept %q", got)
	}
	if got := send("p1", msg(topic, "c")); got != "c" {
		t.Fatalf("kept %q", got)
	}
	if got := send("p2", msg(topic, "c")); got != "c" {
		t.Fatalf("a suspect peer's message held an honest copy out: kept %q", got)
	}
}

// TestPeerLeftOutGetsAQueueAndIsGreetedAsMissed: B subscribes to A's
// topic over its own stream, but A's stream to B fails (B serves no gossip
// protocol yet), and gossipsub, having no queue to B, makes none again by
// itself while B stays subscribed and connected. A's publications, which
// gossipsub has no queue to B to put in, are left out for B (LeftOut), not
// counted as drops. Once B serves the protocol (with no identify push to
// tell A), A's next publication left out for B has A make the queue
// (requeue), B receives what A publishes after, and A greets B as having
// missed a publication.
func TestPeerLeftOutGetsAQueueAndIsGreetedAsMissed(t *testing.T) {
	ctx := context.Background()
	ha, hb := newHost(t), newHost(t)
	greeted := make(chan bool, 8)
	a, err := New(ctx, ha, "test", acceptAll, nil, WithLogger(quiet()), WithPeerJoin(func(p peer.ID, missed bool) {
		if p == hb.ID() {
			greeted <- missed
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := hb.Connect(ctx, peer.AddrInfo{ID: ha.ID(), Addrs: ha.Addrs()}); err != nil {
		t.Fatal(err)
	}
	// B's subscription, as a gossipsub peer sends it, on B's own stream.
	s, err := hb.NewStream(ctx, ha.ID(), lpubsub.GossipSubID_v11)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	yes, topic := true, TopicName("test")
	writeRPC(t, s, &pb.RPC{Subscriptions: []*pb.RPC_SubOpts{{Subscribe: &yes, Topicid: &topic}}})

	// While B serves no gossip protocol, A counts B in the topic with no
	// queue to it, and what A publishes leaves B out.
	n := 0
	testkit.WaitFor(t, 10*time.Second, "three of A's publications left out for B", func() error {
		n++
		if err := a.Publish(ctx, fmt.Appendf(nil, "good before %d", n)); err != nil {
			return err
		}
		if left := a.LeftOut(); left < 3 {
			return fmt.Errorf("%d left out", left)
		}
		return nil
	})
	if all := a.DroppedNoStream(); all != 0 {
		t.Fatalf("A counted %d messages dropped for want of a queue, want none: its own publications are left out", all)
	}
	// B serves the protocol now, added to its switch directly, which
	// sends A no identify push.
	got := make(chan string, 64)
	hb.Mux().AddHandler(lpubsub.GossipSubID_v11, func(_ protocol.ID, rwc io.ReadWriteCloser) error {
		defer rwc.Close()
		r := bufio.NewReader(rwc)
		for {
			size, err := binary.ReadUvarint(r)
			if err != nil {
				return err
			}
			buf := make([]byte, size)
			if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			var rpc pb.RPC
			if err := proto.Unmarshal(buf, &rpc); err != nil {
				return err
			}
			for _, m := range rpc.GetPublish() {
				select {
				case got <- string(m.GetData()):
				default:
				}
			}
		}
	})
	testkit.WaitFor(t, 10*time.Second, "a publication of A's received by B", func() error {
		n++
		if err := a.Publish(ctx, fmt.Appendf(nil, "good after %d", n)); err != nil {
			return err
		}
		select {
		case m := <-got:
			t.Logf("B received %q", m)
			return nil
		default:
			return fmt.Errorf("none yet (%d left out for B, A has a stream to B: %v)", a.LeftOut(), a.HasStream(hb.ID()))
		}
	})
	select {
	case missed := <-greeted:
		if !missed {
			t.Fatal("A greeted B as having missed nothing; it left B out of its publications")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A did not greet B once its stream to B opened")
	}
	if all := a.DroppedNoStream(); all != 0 {
		t.Fatalf("A counted %d messages dropped for want of a queue, want none", all)
	}
}

// writeRPC writes rpc on w as gossipsub frames it: its length as a
// varint, then its bytes.
func writeRPC(t *testing.T, w io.Writer, rpc *pb.RPC) {
	t.Helper()
	b, err := proto.Marshal(rpc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(append(binary.AppendUvarint(nil, uint64(len(b))), b...)); err != nil {
		t.Fatal(err)
	}
}

// TestControlBeyondTheBoundIsRefused: gossipsub bounds an RPC's control
// part (512 KiB) on its raw bytes before decoding it, reading a publish
// field as length-delimited. An RPC that encodes a publish field as a
// varint passes that check with a control part of 600 KB, which the decoder
// takes whole: inspectControl refuses it, and passes an RPC of normal size.
func TestControlBeyondTheBoundIsRefused(t *testing.T) {
	const limit = lpubsub.DefaultMaxControlMessageSize
	ids := make([]string, 6000)
	for i := range ids {
		ids[i] = fmt.Sprintf("%0100d", i)
	}
	control, err := proto.Marshal(&pb.ControlMessage{Iwant: []*pb.ControlIWant{{MessageIDs: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := proto.Marshal(&pb.Message{Data: make([]byte, len(control)-limit/2), Topic: proto.String("t")})
	if err != nil {
		t.Fatal(err)
	}
	field := func(num protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
	}
	rest := append(field(3, control), field(2, msg)...)
	// Field 2 (publish) as a varint whose value, read as a length, spans
	// the control field and the publish field after it: the raw check
	// takes the message data in that span for payload and subtracts it.
	raw := protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), uint64(len(rest)))
	raw = append(raw, rest...)
	if err := pb.ValidateRawRPCControlMessageSize(raw, limit); err != nil {
		t.Fatalf("the crafted RPC does not pass gossipsub's raw check: %v", err)
	}
	rpc := &lpubsub.RPC{}
	if err := proto.Unmarshal(raw, &rpc.RPC); err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(rpc.Control); n <= limit {
		t.Fatalf("decoded control part %d bytes, want more than %d", n, limit)
	}
	inspect := inspectControl(limit)
	if err := inspect("attacker", rpc); err == nil {
		t.Errorf("a control part of %d bytes passed, want refused above %d", proto.Size(rpc.Control), limit)
	}
	normal := &lpubsub.RPC{RPC: pb.RPC{Control: &pb.ControlMessage{Iwant: []*pb.ControlIWant{{MessageIDs: ids[:100]}}}}}
	if err := inspect("honest", normal); err != nil {
		t.Errorf("a control part of %d bytes refused: %v", proto.Size(normal.Control), err)
	}
}
