package router

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbiter-serve/arbiter/fleet"
)

// cutTransport is memberlist's own network transport with a switch that cuts the router
// off: nothing it sends leaves, nothing sent to it arrives (a network partition; this
// kernel has no netem to make one).
type cutTransport struct {
	// memberlist.Transport alone, not *NetTransport: its node-aware methods (WriteToAddress,
	// DialAddressTimeout) would go round the cut.
	memberlist.Transport
	cut     atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
}

func newCutTransport(t *testing.T) *cutTransport {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	ct := &cutTransport{Transport: nt, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn)}
	go func() {
		for p := range nt.PacketCh() {
			if !ct.cut.Load() {
				ct.packets <- p
			}
		}
	}()
	go func() {
		for c := range nt.StreamCh() {
			if ct.cut.Load() {
				c.Close()
				continue
			}
			ct.streams <- c
		}
	}()
	return ct
}

func (c *cutTransport) PacketCh() <-chan *memberlist.Packet { return c.packets }
func (c *cutTransport) StreamCh() <-chan net.Conn           { return c.streams }

func (c *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if c.cut.Load() {
		return time.Now(), nil // lost on the way
	}
	return c.Transport.WriteTo(b, addr)
}

func (c *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if c.cut.Load() {
		return nil, errors.New("network unreachable (cut)")
	}
	return c.Transport.DialTimeout(addr, timeout)
}

// gossipWait bounds what gossip's failure detection takes: seconds, not milliseconds.
const gossipWait = 60 * time.Second

// peered is a router's pool, proxy and shared view, as Run wires them.
type peered struct {
	*rig
	view *peerView
	tr   *cutTransport
}

// startPeered starts a router over replicas sharing its view with the routers at join.
func startPeered(t *testing.T, name string, join []string, replicas ...fleet.Replica) *peered {
	t.Helper()
	r := startRouter(t, nil, replicas...)
	tr := newCutTransport(t)
	v, stop, err := startPeers(PeerOptions{Listen: "127.0.0.1:0", Join: join, Name: name, transport: tr}, r.pool, r.reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	r.pool.sharePeers(v)
	return &peered{rig: r, view: v, tr: tr}
}

func (p *peered) gauge(g prometheus.Gauge) float64 { return testutil.ToFloat64(g) }

// A request one router sends shows in its peer's view of the replica: in flight while it
// runs, queued in the replica's model, its prefix held there (affinity and prefix memory).
func TestPeersSeeWhatEachOtherSent(t *testing.T) {
	info := fleet.Replica{ID: "x", Address: "127.0.0.1:1", Model: testModel, Provider: "local", Region: "lo", Capacity: fleet.OnDemand, PricePerHour: 1}
	a := startPeered(t, "a", nil, info)
	b := startPeered(t, "b", []string{a.view.Addr()}, info)
	waitFor(t, "both routers see one peer", func() bool { return a.view.alive() == 1 && b.view.alive() == 1 })

	prompt := strings.Repeat("the conversation so far, turn after turn. ", 400) // 16.8 KB: 65 blocks
	req := &Request{Model: testModel, PromptTokens: 4000, OutTokens: 200, Prefix: prefixBlocks(prompt, 0), Now: time.Now(), Streamed: true}
	ax, bx := a.pool.Get("x"), b.pool.Get("x")
	pred := ax.Begin(req, time.Second)
	waitFor(t, "b sees a's request in flight on x", func() bool { return bx.inflightSeen() == 1 })
	if got := bx.Load(time.Now(), time.Second); got != 1 {
		t.Fatalf("b's load of x = %v, want 1", got)
	}
	bx.mu.Lock()
	queued, held := len(bx.twin.queue), bx.prefixes.match(req.Prefix, 0)
	bx.mu.Unlock()
	if queued != 1 || held < 60*defaultBlockTokens {
		t.Fatalf("b's model of x: %d prompts queued (want 1), %d tokens of the prompt held (want its 65 blocks, at the last checkpoint 64)", queued, held)
	}
	if holder, tokens := b.pool.aff.lookup(req.Prefix, 0); holder != bx || tokens < 60*defaultBlockTokens {
		t.Fatalf("b's affinity: holder %v with %d tokens, want x with the prompt", holder, tokens)
	}
	ax.FirstToken(pred, time.Now())
	ax.End(pred, time.Now())
	waitFor(t, "b sees a's request end", func() bool { return bx.inflightSeen() == 0 && b.gauge(b.view.theirOpen) == 0 })
	if ax.InFlight() != 0 || bx.InFlight() != 0 {
		t.Fatalf("own in-flight counts: a %d, b %d; a peer's requests are not a router's own (its load reports)", ax.InFlight(), bx.InFlight())
	}
}

// A router cut off from its peers keeps serving on its own view, with no error, says so in
// arbiter_router_shared_view, forgets the requests of peers it can no longer hear; and once
// the network is back it rejoins and shares again.
func TestPeerCutOffKeepsServingAndRejoins(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	info := replica("x", s, fleet.OnDemand, 1)
	a := startPeered(t, "a", nil, info)
	b := startPeered(t, "b", []string{a.view.Addr()}, info)
	c := startPeered(t, "c", []string{a.view.Addr(), b.view.Addr()}, info)
	for _, p := range []*peered{a, b, c} {
		waitFor(t, p.view.name+" sees two peers", func() bool { return p.view.alive() == 2 })
		if p.gauge(p.view.shared) != 1 {
			t.Fatalf("%s: arbiter_router_shared_view %v with two peers", p.view.name, p.gauge(p.view.shared))
		}
	}
	// a holds a request open on x; c sees it.
	req := &Request{Model: testModel, PromptTokens: 100, OutTokens: 10, Now: time.Now()}
	ax, cx := a.pool.Get("x"), c.pool.Get("x")
	pred := ax.Begin(req, time.Second)
	waitFor(t, "c sees a's request", func() bool { return cx.inflightSeen() == 1 })

	c.tr.cut.Store(true)
	waitWithin(t, gossipWait, "c finds itself alone", func() bool { return c.view.alive() == 0 })
	if c.gauge(c.view.shared) != 0 || c.gauge(c.view.peers) != 0 {
		t.Fatalf("cut off: arbiter_router_shared_view %v, arbiter_router_peers %v; want 0, 0", c.gauge(c.view.shared), c.gauge(c.view.peers))
	}
	if cx.inflightSeen() != 0 {
		t.Fatalf("c still counts %d requests of peers it cannot hear", cx.inflightSeen())
	}
	for i := range 5 {
		if resp, body := post(t, c.url+"/v1/chat/completions", chatBody(i%2 == 0, "")); resp.StatusCode != 200 {
			t.Fatalf("request %d through the cut-off router: %d %s", i, resp.StatusCode, body)
		}
	}
	ax.End(pred, time.Now())

	c.tr.cut.Store(false)
	for _, p := range []*peered{a, b, c} {
		waitWithin(t, gossipWait, p.view.name+" sees two peers again", func() bool { return p.view.alive() == 2 })
	}
	if c.gauge(c.view.shared) != 1 {
		t.Fatal("rejoined, but arbiter_router_shared_view is not 1")
	}
	pred = ax.Begin(req, time.Second)
	waitFor(t, "c sees a's next request", func() bool { return cx.inflightSeen() == 1 })
	ax.End(pred, time.Now())
	waitFor(t, "c sees it end", func() bool { return cx.inflightSeen() == 0 })
}

// Events too big for a packet are dropped and counted, the rest packed in order within it.
func TestPackEvents(t *testing.T) {
	var evs []peerEvent
	for i := range 40 {
		evs = append(evs, peerEvent{Kind: peerEnd, ID: uint64(i + 1)})
	}
	big := peerEvent{Kind: peerBegin, ID: 99, Replica: "x", Checkpoints: make([]uint64, 200)}
	for i := range big.Checkpoints {
		big.Checkpoints[i] = ^uint64(i)
	}
	evs = append(evs[:20], append([]peerEvent{big}, evs[20:]...)...)
	packets, dropped := packEvents("a", evs)
	if dropped != 1 {
		t.Fatalf("dropped %d, want the one event over %d bytes", dropped, maxPeerPacket)
	}
	var ids []uint64
	for _, b := range packets {
		if len(b) > maxPeerPacket {
			t.Fatalf("a packet of %d bytes", len(b))
		}
		var pk peerPacket
		if err := msgpack.Unmarshal(b, &pk); err != nil {
			t.Fatal(err)
		}
		for _, ev := range pk.Events {
			ids = append(ids, ev.ID)
		}
	}
	if fmt.Sprint(ids) != fmt.Sprint(func() []uint64 {
		var want []uint64
		for i := range 40 {
			want = append(want, uint64(i+1))
		}
		return want
	}()) {
		t.Fatalf("events out of order or lost: %v", ids)
	}
	// The longest prefix a request carries fits one packet.
	full := make([]uint64, maxPrefixBlocks)
	for i := range full {
		full[i] = ^uint64(i) // 9 bytes each in msgpack
	}
	v := &peerView{name: "router-with-a-long-name-0123456789", open: map[uint64]struct{}{}, flush: make(chan struct{}, 1)}
	v.begin(NewDetachedReplica(fleet.Replica{ID: "replica-with-a-long-id-0123456789abcdef"}, nil), shape{prompt: 32768, cached: 1, out: 4096, prefix: full, blockTokens: 64}, true, time.Now())
	if _, dropped := packEvents(v.name, v.pending); dropped != 0 {
		t.Fatal("a begin with the longest prefix does not fit a packet")
	}
}

// A peer's packet is input: whatever it holds, the view neither panics nor takes it in.
func TestPeerEventsRejectBadInput(t *testing.T) {
	info := fleet.Replica{ID: "x", Address: "127.0.0.1:1", Model: testModel}
	r := startRouter(t, nil, info)
	v := &peerView{name: "b", pool: r.pool, theirs: map[peerKey]peerReq{}, theirOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"event"})}
	now := time.Now()
	for _, c := range []struct {
		ev   peerEvent
		want string
	}{
		{peerEvent{Kind: peerBegin, ID: 1, Replica: "nope", Prompt: 10}, "unknown_replica"},
		{peerEvent{Kind: peerBegin, ID: 1, Replica: "x", Prompt: -1}, "malformed"},
		{peerEvent{Kind: peerBegin, ID: 1, Replica: "x", Prompt: 10, Blocks: 40, Checkpoints: []uint64{1}}, "malformed"},
		{peerEvent{Kind: peerBegin, ID: 1, Replica: "x", Prompt: 10, Blocks: maxPrefixBlocks + 1}, "malformed"},
		{peerEvent{Kind: peerEnd, ID: 7}, "unknown_request"},
		{peerEvent{Kind: 9, ID: 1}, "malformed"},
	} {
		if got := v.apply("a", c.ev, now); got != c.want {
			t.Errorf("%+v: %q, want %q", c.ev, got, c.want)
		}
	}
	v.NotifyMsg([]byte("not msgpack at all"))
	if got := testutil.ToFloat64(v.events.WithLabelValues("dropped_malformed")); got != 1 {
		t.Fatalf("a garbled packet counted %v times as malformed", got)
	}
	if r.pool.Get("x").inflightSeen() != 0 {
		t.Fatal("a rejected event changed the view")
	}
}

func FuzzPeerPacket(f *testing.F) {
	pk, _ := packEvents("a", []peerEvent{{Kind: peerBegin, ID: 1, Replica: "x", Prompt: 10, Blocks: 2, Checkpoints: []uint64{1, 2}}, {Kind: peerEnd, ID: 1}})
	f.Add(pk[0])
	f.Add([]byte{0x92, 0xa1, 'a', 0x91, 0x9a})
	info := fleet.Replica{ID: "x", Address: "127.0.0.1:1", Model: testModel}
	cfg := Defaults()
	pool := NewPool(&cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), nil)
	pool.SetReplicas([]fleet.Replica{info})
	f.Fuzz(func(t *testing.T, b []byte) {
		v := &peerView{name: "b", pool: pool, theirs: map[peerKey]peerReq{}, theirOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}),
			events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"event"})}
		v.NotifyMsg(b)
		v.MergeRemoteState(b, false)
		nodes := map[string]bool{}
		for k := range v.theirs {
			nodes[k.node] = true
		}
		for n := range nodes {
			v.dropNode(n, nil, time.Now())
		}
		if n := pool.Get("x").peerInflight.Load(); n != 0 {
			t.Fatalf("%d peer requests left after their nodes were dropped", n)
		}
	})
}
