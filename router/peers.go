package router

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"
)

// Routers that serve one fleet side by side (behind a load balancer, or as a gateway's
// endpoint pickers) share their view of it: each tells its peers what it sent where, and
// each applies what its peers sent to its own model of every replica, as if it had sent it
// itself (the in-flight count, the twin's queue, the prefix memory and the affinity table).
// Without it each saw only its own share of the load and remembered only the prefixes it
// routed: three pickers on Mooncake met the SLO for 61.8 % of requests against 75.5 % for
// one (bench/docs/picker.md).
//
// Membership, failure detection and transport are hashicorp/memberlist's (SWIM gossip):
// each router sends its events straight to every member it knows alive (UDP, best effort,
// batched over BatchWindow), and memberlist's periodic push/pull (TCP) carries the list
// of the sender's requests still open, from which a receiver drops what a lost packet left
// behind. A router cut off from every peer routes on its own view (what its requests and
// its scrapes of the replicas show), says so in arbiter_router_shared_view, and keeps
// joining its seeds until it is back.

// PeerOptions configure the shared view.
type PeerOptions struct {
	// Listen is where this router's gossip listens, TCP and UDP, host:port (port 0: any).
	Listen string
	// Advertise is the address peers reach it on, when Listen's is not (0.0.0.0, NAT).
	Advertise string
	// Join are peers to join, host:port or a DNS name resolving to several (a headless
	// Service); joining is retried while fewer peers are alive than were ever seen.
	Join []string
	// Name is this router's name among its peers (unique; the router's ID by default).
	Name string
	// BatchWindow is how long an event waits for others to share its packet (0: sent at
	// once; DefaultPeerBatchWindow when negative).
	BatchWindow time.Duration
	// transport, in tests, stands in for memberlist's network transport (to cut one off).
	transport memberlist.Transport
}

// PeerFlags defines -peer-listen, -peer-advertise and -peers on fs (the router's and the
// picker's); the returned func reads them after parsing: nil options without -peer-listen.
func PeerFlags(fs *flag.FlagSet) func() (*PeerOptions, error) {
	listen := fs.String("peer-listen", "", "share this router's view of the fleet (what it sent where: in-flight counts, queued prompts, prefixes) with the other routers or pickers serving it, over gossip (hashicorp/memberlist, TCP and UDP) on this address, e.g. 0.0.0.0:7946; with -peers")
	adv := fs.String("peer-advertise", "", "the address peers reach -peer-listen on, where it is not the one bound (0.0.0.0, NAT), e.g. $(POD_IP):7946")
	window := fs.Duration("peer-batch-window", DefaultPeerBatchWindow, "how long a shared-view event waits for others to share its packet (0: each sent at once)")
	peers := fs.String("peers", "", "peers to join, comma-separated host:port, or a DNS name resolving to all of them (a headless Service); with -peer-listen")
	return func() (*PeerOptions, error) {
		if *listen == "" {
			if *peers != "" {
				return nil, errors.New("-peers needs -peer-listen: the address this router's gossip listens on")
			}
			return nil, nil
		}
		o := &PeerOptions{Listen: *listen, Advertise: *adv, BatchWindow: *window}
		if *window < 0 {
			return nil, fmt.Errorf("-peer-batch-window %v: want ≥ 0", *window)
		}
		if _, _, err := splitHostPort(*listen); err != nil {
			return nil, fmt.Errorf("-peer-listen %q: %w", *listen, err)
		}
		for _, p := range strings.Split(*peers, ",") {
			if p = strings.TrimSpace(p); p != "" {
				o.Join = append(o.Join, p)
			}
		}
		return o, nil
	}
}

// DefaultPeerBatchWindow is how long events wait to share a packet by default: none. Each
// goes as soon as the sender is free, and what queued meanwhile shares its packet. A 2 ms
// window cost 8 routers on Mooncake 11 points of SLO attainment (67–68 % against 79 %,
// bench/docs/picker.md): the requests of one instant (the trace's 1 s resolution) reached
// several routers within the window, each saw the same cheapest replica free, and all sent
// it theirs.
const DefaultPeerBatchWindow = 0

// maxPeerPacket bounds a packet of events: under memberlist's UDP buffer (1,400 bytes, a LAN
// MTU less headers), so no packet is cut. A begin carries at most 96 prefix checkpoints.
const maxPeerPacket = 1200

// peerRejoinEvery is how often a router with fewer peers alive than it has seen joins again.
const peerRejoinEvery = 5 * time.Second

// peerOrphanAfter is how old a peer's request must be before a push/pull that does not list
// it drops it (the begin may have crossed the push/pull in flight).
const peerOrphanAfter = 5 * time.Second

const (
	peerBegin uint8 = iota + 1
	peerFirst
	peerEnd
)

// peerEvent is one thing a router did on a replica. A begin carries the request's shape;
// the others refer to it by ID.
type peerEvent struct {
	_msgpack struct{} `msgpack:",as_array"`
	Kind     uint8
	ID       uint64
	// At is when it happened, in the sender's clock (Unix nanoseconds).
	At       int64
	Replica  string
	Prompt   int
	Cached   int
	Out      int
	Streamed bool
	// Blocks is the prompt's prefix length in blocks; Checkpoints its hashes at the
	// affinity checkpoints, shortest first: all that the receiver's tables keep.
	Blocks      int
	Checkpoints []uint64
	BlockTokens float64
}

// peerPacket is what one UDP packet carries: events from one router, in order.
type peerPacket struct {
	_msgpack struct{} `msgpack:",as_array"`
	Node     string
	Events   []peerEvent
}

// peerState is a router's push/pull state: the requests it has open.
type peerState struct {
	_msgpack struct{} `msgpack:",as_array"`
	Node     string
	Open     []uint64
}

// peerKey names a peer's request.
type peerKey struct {
	node string
	id   uint64
}

// peerReq is a peer's request as this router applied it.
type peerReq struct {
	r   *Replica
	seq *twinSeq
	at  time.Time
}

// peerView is this router's end of the shared view.
type peerView struct {
	name   string
	pool   *Pool
	log    *slog.Logger
	window time.Duration
	ml     *memberlist.Memberlist
	join   []string

	nextID atomic.Uint64

	mu      sync.Mutex
	pending []peerEvent
	open    map[uint64]struct{} // ours, for push/pull
	theirs  map[peerKey]peerReq
	flush   chan struct{}
	members map[string]struct{} // peers alive, as memberlist told its events
	seen    int                 // the most peers alive at once
	alone   bool

	peers, shared, theirOpen prometheus.Gauge
	events                   *prometheus.CounterVec
}

// startPeers joins the shared view; it runs until stop is called.
func startPeers(o PeerOptions, pool *Pool, reg prometheus.Registerer, logger *slog.Logger) (v *peerView, stop func(), err error) {
	if o.Name == "" {
		return nil, nil, errors.New("peers: a router needs a name among its peers")
	}
	host, port, err := splitHostPort(o.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("peers: listen %q: %w", o.Listen, err)
	}
	if o.BatchWindow < 0 {
		o.BatchWindow = DefaultPeerBatchWindow
	}
	v = &peerView{name: o.Name, window: o.BatchWindow, pool: pool, log: logger, join: o.Join, open: map[uint64]struct{}{}, theirs: map[peerKey]peerReq{}, members: map[string]struct{}{}, flush: make(chan struct{}, 1),
		peers:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "arbiter_router_peers", Help: "Other routers this router shares its view of the fleet with, alive as its gossip sees them."}),
		shared:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "arbiter_router_shared_view", Help: "1 while this router shares its view of the fleet with at least one peer; 0 when cut off from all of them (it routes on its own requests and scrapes alone)."}),
		theirOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "arbiter_router_peer_requests", Help: "Peers' requests open on the replicas, as this router applied them to its view."}),
		events:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "arbiter_router_peer_events_total", Help: "Events of the shared view: sent (to each peer), received, or dropped (with why)."}, []string{"event"}),
	}
	reg.MustRegister(v.peers, v.shared, v.theirOpen, v.events)
	// IDs start at the clock, so a router restarted under the same name before its peers
	// found it gone does not reuse the IDs of its requests they still hold.
	v.nextID.Store(uint64(time.Now().UnixNano()))
	cfg := memberlist.DefaultLANConfig()
	cfg.Name = o.Name
	cfg.BindAddr, cfg.BindPort = host, port
	if o.Advertise != "" {
		ah, ap, err := splitHostPort(o.Advertise)
		if err != nil {
			return nil, nil, fmt.Errorf("peers: advertise %q: %w", o.Advertise, err)
		}
		cfg.AdvertiseAddr, cfg.AdvertisePort = ah, ap
	}
	cfg.PushPullInterval = 10 * time.Second
	cfg.Delegate = v
	cfg.Events = v
	cfg.Logger = log.New(&slogWriter{l: logger}, "", 0)
	if o.transport != nil {
		cfg.Transport = o.transport
	} else if port == 0 {
		// memberlist binds a random port only through its own transport, and then its
		// AdvertisePort must name it.
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: 0, Logger: cfg.Logger})
		if err != nil {
			return nil, nil, fmt.Errorf("peers: %w", err)
		}
		cfg.Transport = nt
		if o.Advertise == "" {
			cfg.AdvertisePort = nt.GetAutoBindPort()
			if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
				cfg.AdvertiseAddr = host
			} // else memberlist advertises a private address of the host's
		}
	}
	if v.ml, err = memberlist.Create(cfg); err != nil {
		return nil, nil, fmt.Errorf("peers: %w", err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); v.sendLoop(done) }()
	go func() { defer wg.Done(); v.rejoinLoop(done) }()
	v.rejoin()
	if v.alive() == 0 && len(o.Join) > 0 {
		logger.Info("no peer reachable yet: routing on this router's own view of the fleet until one joins", "join", o.Join)
	}
	return v, func() {
		close(done)
		wg.Wait()
		_ = v.ml.Leave(time.Second)
		_ = v.ml.Shutdown()
	}, nil
}

// Addr is where peers reach this router's gossip.
func (v *peerView) Addr() string {
	n := v.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

func splitHostPort(hp string) (string, int, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return h, n, nil
}

// --- what this router sent ---

// begin tells peers that r took a request of shape p; it returns the request's ID.
func (v *peerView) begin(r *Replica, p shape, streamed bool, at time.Time) uint64 {
	id := v.nextID.Add(1)
	ev := peerEvent{Kind: peerBegin, ID: id, At: at.UnixNano(), Replica: r.Info().ID, Prompt: p.prompt, Cached: p.cached, Out: p.out, Streamed: streamed,
		Blocks: len(p.prefix), BlockTokens: p.blockTokens}
	for k := 1; k <= len(p.prefix); k++ {
		if checkpoint(k) {
			ev.Checkpoints = append(ev.Checkpoints, p.prefix[k-1])
		}
	}
	v.mu.Lock()
	v.open[id] = struct{}{}
	v.queueLocked(ev)
	v.mu.Unlock()
	return id
}

// first tells peers that request id's first token came at at.
func (v *peerView) first(id uint64, at time.Time) {
	if id == 0 {
		return
	}
	v.mu.Lock()
	v.queueLocked(peerEvent{Kind: peerFirst, ID: id, At: at.UnixNano()})
	v.mu.Unlock()
}

// end tells peers that request id ended at at.
func (v *peerView) end(id uint64, at time.Time) {
	if id == 0 {
		return
	}
	v.mu.Lock()
	delete(v.open, id)
	v.queueLocked(peerEvent{Kind: peerEnd, ID: id, At: at.UnixNano()})
	v.mu.Unlock()
}

func (v *peerView) queueLocked(ev peerEvent) {
	v.pending = append(v.pending, ev)
	if len(v.pending) == 1 {
		select {
		case v.flush <- struct{}{}:
		default:
		}
	}
}

// sendLoop sends what is pending, a batch per BatchWindow, to every peer alive.
func (v *peerView) sendLoop(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-v.flush:
		}
		if v.window > 0 {
			select {
			case <-done:
				return
			case <-time.After(v.window):
			}
		}
		v.mu.Lock()
		evs := v.pending
		v.pending = nil
		v.mu.Unlock()
		packets, dropped := packEvents(v.name, evs)
		if dropped > 0 {
			v.events.WithLabelValues("dropped_too_big").Add(float64(dropped))
		}
		for _, n := range v.ml.Members() {
			if n.Name == v.name {
				continue
			}
			for _, b := range packets {
				if err := v.ml.SendBestEffort(n, b); err != nil {
					v.events.WithLabelValues("dropped_send").Inc()
					continue
				}
				v.events.WithLabelValues("sent").Inc()
			}
		}
	}
}

// packEvents encodes events into packets of at most maxPeerPacket bytes each, in order; an
// event too big for a packet on its own is dropped (counted).
func packEvents(node string, evs []peerEvent) (packets [][]byte, dropped int) {
	enc := func(evs []peerEvent) []byte {
		b, err := msgpack.Marshal(&peerPacket{Node: node, Events: evs})
		if err != nil {
			panic(err) // a struct of plain fields always encodes
		}
		return b
	}
	for start := 0; start < len(evs); {
		end := start + 1
		b := enc(evs[start:end])
		if len(b) > maxPeerPacket {
			dropped++
			start = end
			continue
		}
		for end < len(evs) {
			nb := enc(evs[start : end+1])
			if len(nb) > maxPeerPacket {
				break
			}
			b, end = nb, end+1
		}
		packets = append(packets, b)
		start = end
	}
	return packets, dropped
}

// --- what peers sent ---

// NotifyMsg implements memberlist.Delegate: a packet of a peer's events.
func (v *peerView) NotifyMsg(b []byte) {
	pk, err := decodePacket(b)
	if err != nil {
		v.events.WithLabelValues("dropped_malformed").Inc()
		return
	}
	now := time.Now()
	for _, ev := range pk.Events {
		v.events.WithLabelValues("received").Inc()
		if why := v.apply(pk.Node, ev, now); why != "" {
			v.events.WithLabelValues("dropped_" + why).Inc()
		}
	}
}

// apply applies one peer's event to this router's view; it says why not, if not.
func (v *peerView) apply(node string, ev peerEvent, now time.Time) string {
	key := peerKey{node, ev.ID}
	at := eventTime(ev.At, now)
	switch ev.Kind {
	case peerBegin:
		prefix, ok := expandCheckpoints(ev.Blocks, ev.Checkpoints)
		if !ok || ev.Prompt < 0 || ev.Cached < 0 || ev.Out < 0 {
			return "malformed"
		}
		r := v.pool.Get(ev.Replica)
		if r == nil {
			return "unknown_replica"
		}
		v.mu.Lock()
		_, dup := v.theirs[key]
		v.mu.Unlock()
		if dup {
			return "duplicate" // a peer's IDs are unique: a second begin is not its own
		}
		p := shape{prompt: max(ev.Prompt, 1), cached: min(ev.Cached, max(ev.Prompt-1, 0)), out: ev.Out, prefix: prefix, blockTokens: ev.BlockTokens}
		seq := r.peerBegin(at, p, ev.Streamed)
		v.pool.aff.record(prefix, r)
		v.mu.Lock()
		v.theirs[key] = peerReq{r: r, seq: seq, at: now}
		v.theirOpen.Set(float64(len(v.theirs)))
		v.mu.Unlock()
	case peerFirst, peerEnd:
		v.mu.Lock()
		pr, ok := v.theirs[key]
		if ok && ev.Kind == peerEnd {
			delete(v.theirs, key)
			v.theirOpen.Set(float64(len(v.theirs)))
		}
		v.mu.Unlock()
		if !ok {
			return "unknown_request"
		}
		if ev.Kind == peerFirst {
			pr.r.peerFirst(pr.seq, at)
		} else {
			pr.r.peerEnd(pr.seq, at)
		}
	default:
		return "malformed"
	}
	return ""
}

// A peer's packet is input like any other. msgpack's generic decoding makes a slice as long
// as its header says before reading it (vmihailenco/msgpack v5.4.1's allocation limit does not
// apply to slices of structs or integers: decode_slice.go tests the flag against 1): 25 bytes
// declaring four billion events took the router's memory. So packets are read field by field,
// and no length is believed beyond the bytes that could hold it.

var errPeerPacket = errors.New("malformed peer packet")

// decodePacket reads what packEvents wrote.
func decodePacket(b []byte) (peerPacket, error) {
	d := msgpack.NewDecoder(bytes.NewReader(b))
	node, n, err := decodeHead(d, len(b))
	if err != nil {
		return peerPacket{}, err
	}
	pk := peerPacket{Node: node, Events: make([]peerEvent, n)}
	for i := range pk.Events {
		if err := decodeEvent(d, &pk.Events[i], len(b)); err != nil {
			return pk, err
		}
	}
	return pk, nil
}

// decodeHead reads what a packet and a push/pull state start with: a two-field array of
// the sender's name and the length of what follows, at most size (the bytes that carry it).
func decodeHead(d *msgpack.Decoder, size int) (node string, n int, err error) {
	if fields, err := d.DecodeArrayLen(); err != nil || fields != 2 {
		return "", 0, errPeerPacket
	}
	if node, err = d.DecodeString(); err != nil || node == "" {
		return "", 0, errPeerPacket
	}
	if n, err = d.DecodeArrayLen(); err != nil || n < 0 || n > size {
		return "", 0, errPeerPacket
	}
	return node, n, nil
}

// decodeUint64s reads n unsigned integers.
func decodeUint64s(d *msgpack.Decoder, n int) ([]uint64, error) {
	out := make([]uint64, n)
	for i := range out {
		var err error
		if out[i], err = d.DecodeUint64(); err != nil {
			return nil, errPeerPacket
		}
	}
	return out, nil
}

// peerEventFields is how many fields a peerEvent encodes.
const peerEventFields = 11

func decodeEvent(d *msgpack.Decoder, ev *peerEvent, size int) error {
	if n, err := d.DecodeArrayLen(); err != nil || n != peerEventFields {
		return errPeerPacket
	}
	var errs [peerEventFields]error
	ev.Kind, errs[0] = d.DecodeUint8()
	ev.ID, errs[1] = d.DecodeUint64()
	ev.At, errs[2] = d.DecodeInt64()
	ev.Replica, errs[3] = d.DecodeString()
	ev.Prompt, errs[4] = d.DecodeInt()
	ev.Cached, errs[5] = d.DecodeInt()
	ev.Out, errs[6] = d.DecodeInt()
	ev.Streamed, errs[7] = d.DecodeBool()
	ev.Blocks, errs[8] = d.DecodeInt()
	n, err := d.DecodeArrayLen()
	if err != nil || n > size || n > maxPrefixBlocks {
		return errPeerPacket
	}
	if n > 0 {
		if ev.Checkpoints, err = decodeUint64s(d, n); err != nil {
			return err
		}
	}
	ev.BlockTokens, errs[10] = d.DecodeFloat64()
	if errors.Join(errs[:]...) != nil {
		return errPeerPacket
	}
	return nil
}

// decodeState reads what LocalState wrote.
func decodeState(b []byte) (peerState, error) {
	d := msgpack.NewDecoder(bytes.NewReader(b))
	node, n, err := decodeHead(d, len(b))
	if err != nil {
		return peerState{}, err
	}
	open, err := decodeUint64s(d, n)
	if err != nil {
		return peerState{}, err
	}
	return peerState{Node: node, Open: open}, nil
}

// peerClockSkew bounds how far in the past a peer's event time is believed: beyond it (a
// clock off, a packet held up) the event happened when it arrived, as far as this router knows.
const peerClockSkew = time.Second

// eventTime is when a peer's event happened in this router's clock: the peer's own time
// (its first tokens then calibrate this router's model of the replica as its own do), unless
// that is in the future or more than peerClockSkew ago.
func eventTime(at int64, now time.Time) time.Time {
	t := time.Unix(0, at)
	if at <= 0 || t.After(now) || now.Sub(t) > peerClockSkew {
		return now
	}
	return t
}

// expandCheckpoints rebuilds a prefix of blocks blocks from its checkpoint hashes (the
// other blocks are zero: nothing reads them).
func expandCheckpoints(blocks int, cps []uint64) ([]uint64, bool) {
	if blocks < 0 || blocks > maxPrefixBlocks {
		return nil, false
	}
	if blocks == 0 {
		return nil, len(cps) == 0
	}
	prefix := make([]uint64, blocks)
	i := 0
	for k := 1; k <= blocks; k++ {
		if checkpoint(k) {
			if i >= len(cps) {
				return nil, false
			}
			prefix[k-1] = cps[i]
			i++
		}
	}
	return prefix, i == len(cps)
}

// dropNode forgets a peer's requests: it left, or was found dead. keep, if set, names the
// ones still open (a push/pull): the others older than peerOrphanAfter go.
func (v *peerView) dropNode(node string, keep map[uint64]bool, now time.Time) int {
	v.mu.Lock()
	var gone []peerReq
	for k, pr := range v.theirs {
		if k.node != node || keep != nil && (keep[k.id] || now.Sub(pr.at) < peerOrphanAfter) {
			continue
		}
		gone = append(gone, pr)
		delete(v.theirs, k)
	}
	v.theirOpen.Set(float64(len(v.theirs)))
	v.mu.Unlock()
	for _, pr := range gone {
		pr.r.peerEnd(pr.seq, now)
	}
	return len(gone)
}

// NodeMeta implements memberlist.Delegate.
func (v *peerView) NodeMeta(int) []byte { return nil }

// GetBroadcasts implements memberlist.Delegate: events go straight to each peer instead.
func (v *peerView) GetBroadcasts(int, int) [][]byte { return nil }

// LocalState implements memberlist.Delegate: the requests this router has open.
func (v *peerView) LocalState(bool) []byte {
	v.mu.Lock()
	st := peerState{Node: v.name, Open: make([]uint64, 0, len(v.open))}
	for id := range v.open {
		st.Open = append(st.Open, id)
	}
	v.mu.Unlock()
	b, err := msgpack.Marshal(&st)
	if err != nil {
		panic(err)
	}
	return b
}

// MergeRemoteState implements memberlist.Delegate: a peer's open requests; what this
// router holds of that peer's beyond them ended while their end was lost.
func (v *peerView) MergeRemoteState(b []byte, _ bool) {
	st, err := decodeState(b)
	if err != nil {
		v.events.WithLabelValues("dropped_malformed").Inc()
		return
	}
	keep := make(map[uint64]bool, len(st.Open))
	for _, id := range st.Open {
		keep[id] = true
	}
	if n := v.dropNode(st.Node, keep, time.Now()); n > 0 {
		v.events.WithLabelValues("dropped_orphan").Add(float64(n))
	}
}

// NotifyJoin implements memberlist.EventDelegate. memberlist calls its event delegate
// holding its node lock: nothing here may call back into it (NumMembers would deadlock).
func (v *peerView) NotifyJoin(n *memberlist.Node) {
	if n.Name == v.name {
		return
	}
	v.log.Info("peer joined the shared view", "peer", n.Name, "addr", n.Address())
	v.mu.Lock()
	v.members[n.Name] = struct{}{}
	v.mu.Unlock()
	v.noteMembers()
}

// NotifyLeave implements memberlist.EventDelegate: a peer left or was found dead, and its
// requests leave this router's view with it.
func (v *peerView) NotifyLeave(n *memberlist.Node) {
	if n.Name == v.name {
		return
	}
	v.mu.Lock()
	delete(v.members, n.Name)
	v.mu.Unlock()
	dropped := v.dropNode(n.Name, nil, time.Now())
	v.log.Warn("peer left the shared view", "peer", n.Name, "its_requests_dropped", dropped)
	v.noteMembers()
}

// NotifyUpdate implements memberlist.EventDelegate.
func (v *peerView) NotifyUpdate(*memberlist.Node) {}

// alive is how many peers are alive now.
func (v *peerView) alive() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.members)
}

func (v *peerView) noteMembers() {
	v.mu.Lock()
	n := len(v.members)
	v.peers.Set(float64(n))
	v.seen = max(v.seen, n)
	wasAlone, alone, hadPeers := v.alone, n == 0, v.seen > 0
	v.alone = alone
	v.mu.Unlock()
	if n > 0 {
		v.shared.Set(1)
	} else {
		v.shared.Set(0)
	}
	if alone && !wasAlone && hadPeers {
		v.log.Warn("cut off from every peer: routing on this router's own view of the fleet until they are back")
	}
}

// rejoinLoop joins the seeds again while fewer peers are alive than were ever seen (or
// none): memberlist does not rejoin a peer it declared dead by itself.
func (v *peerView) rejoinLoop(done <-chan struct{}) {
	t := time.NewTicker(peerRejoinEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		v.mu.Lock()
		short := v.alone || len(v.members) < v.seen
		v.mu.Unlock()
		if short {
			v.rejoin()
		}
	}
}

func (v *peerView) rejoin() {
	if len(v.join) == 0 {
		return
	}
	if _, err := v.ml.Join(v.join); err != nil {
		v.log.Debug("joining peers", "join", v.join, "err", err)
	}
	v.noteMembers()
}

// slogWriter carries memberlist's log lines into the router's log, at debug: its own
// warnings (a suspect peer, a failed probe) are what the peer gauges already say.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(b []byte) (int, error) {
	w.l.Debug("gossip", "msg", string(bytes.TrimRight(b, "\n")))
	return len(b), nil
}

var _ io.Writer = (*slogWriter)(nil)
