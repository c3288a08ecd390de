package router

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

const (
	appKey   = "sk-app-0123456789abcdef0"
	batchKey = "sk-batch-0123456789abcdef"
)

// Over HTTP: an unknown priority is a 400 that names it; a key asking for a band above
// its own runs in its own, and the answer says which.
func TestPriorityHeaderOverHTTP(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := keyedRouter(t, s, "keys: [{name: batch, key: "+batchKey+", priority: sheddable}]", nil)
	resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+batchKey, PriorityHeader, "urgent")
	if typ, _ := openAIError(t, body); resp.StatusCode != 400 || typ != "invalid_request_error" || !strings.Contains(body, `unknown priority \"urgent\": want critical, standard or sheddable`) {
		t.Fatalf("an unknown priority: HTTP %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+batchKey, "X-Gateway-Inference-Objective", "critical")
	if resp.StatusCode != 200 || resp.Header.Get(PriorityHeader) != "sheddable" {
		t.Fatalf("a sheddable key asking for critical: HTTP %d, %s: %q; want 200 run as sheddable, said so\n%s", resp.StatusCode, PriorityHeader, resp.Header.Get(PriorityHeader), body)
	}
	if got := r.counter(t, "arbiter_router_tenant_tokens_total", "tenant", "batch", "band", "sheddable"); got <= 0 {
		t.Fatalf("tenant tokens %v; want the sheddable answer's tokens counted under tenant batch", got)
	}
}

// A service's arbiter.queue comes with the ready set and outranks the router's config; one
// published out of bounds is dropped (the router's own settings apply), not believed.
func TestServiceQueueFromTheControlPlane(t *testing.T) {
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{
		{Name: "q", Models: []string{"m-q"}, Queue: &fleet.Queue{Enabled: true, MaxWaitSeconds: 12, SheddableFill: 0.7}},
		{Name: "bad", Models: []string{"m-bad"}, Queue: &fleet.Queue{Enabled: true, MaxWaitSeconds: 12, SheddableFill: 5}},
	}, nil)
	_, cp := startWithControlPlane(t, fake, nil)
	if rt, ok := cp.Routing("m-q"); !ok || rt.Queue == nil || !rt.Queue.Enabled || rt.Queue.SheddableFill != 0.7 || rt.Queue.MaxWaitSeconds != 12 {
		t.Fatalf("Routing(m-q) = %+v %v; want the service's queue", rt, ok)
	}
	if rt, ok := cp.Routing("m-bad"); !ok || rt.Queue != nil {
		t.Fatalf("Routing(m-bad) = %+v %v; want its out-of-bounds queue dropped", rt, ok)
	}
}

// roomPolicy has room for a gated request only while it holds tokens, and records which
// request (by its max_tokens) each room went to.
type roomPolicy struct {
	mu     sync.Mutex
	tokens int
	order  []int
}

func (p *roomPolicy) gates() {}

func (p *roomPolicy) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if len(cands) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.gate > 0 {
		if p.tokens == 0 {
			return nil
		}
		p.tokens--
		p.order = append(p.order, req.OutTokens)
	}
	return cands[0]
}

func (p *roomPolicy) dispatched() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.order...)
}

// While no replica has room, requests of two sheddable tenants, a standard one and a
// critical one wait in the router's queue, sent from many goroutines; as room opens, one
// request at a time, every critical request goes first, then the standard ones, then the
// two sheddable tenants by turns (the same service each: the virtual token counter), each
// tenant's own first come first served. A request whose client leaves while it waits is
// taken out; every other is answered.
func TestQueueOrdersBandsThenTenants(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	const keys = `keys:
  - {name: crit, key: sk-crit-0123456789abcdef, priority: critical}
  - {name: std, key: sk-std-0123456789abcdefg}
  - {name: shed-a, key: sk-shed-a-0123456789abcdef, priority: sheddable}
  - {name: shed-b, key: sk-shed-b-0123456789abcdef, priority: sheddable}
`
	room := &roomPolicy{}
	r := keyedRouter(t, s, keys, func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWait = time.Minute
		c.SLOs = map[string]SLO{"*": {TTFT: 60, TPOT: 1}}
	})
	r.px.policies["room"] = room
	type sent struct {
		key  string
		out  int // its max_tokens: which request it is
		code int
	}
	var mu sync.Mutex
	var answers []sent
	var wg sync.WaitGroup
	send := func(key string, out int) {
		wg.Go(func() {
			// A long prompt, the same for all: the requests cost the same within a few
			// tokens (their max_tokens tell them apart), so fair shares are turns.
			body := fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"%s"}],"max_tokens":%d}`, testModel, strings.Repeat("hello ", 4000), out)
			resp, _ := post(t, r.url+"/v1/chat/completions", body, "Authorization", "Bearer "+key, "X-Arbiter-Policy", "room")
			mu.Lock()
			answers = append(answers, sent{key, out, resp.StatusCode})
			mu.Unlock()
		})
	}
	waiting := func() float64 { return r.counter(t, "arbiter_router_queue_waiting_requests") }
	// Sheddable first (they would be served first come first served), shed-a's four
	// before shed-b's, then standard, then critical.
	n := 0
	for _, tenant := range []struct {
		key   string
		first int
	}{{"sk-shed-a-0123456789abcdef", 10}, {"sk-shed-b-0123456789abcdef", 20}} {
		for i := range 4 {
			send(tenant.key, tenant.first+i)
			n++
			waitFor(t, "a sheddable request waiting", func() bool { return waiting() == float64(n) })
		}
	}
	for i := range 2 {
		send("sk-std-0123456789abcdefg", 30+i)
		n++
		waitFor(t, "a standard request waiting", func() bool { return waiting() == float64(n) })
	}
	for i := range 2 {
		send("sk-crit-0123456789abcdef", 40+i)
		n++
		waitFor(t, "a critical request waiting", func() bool { return waiting() == float64(n) })
	}
	// The autoscaler sees the demand that waits: the load report counts it as held.
	held := 0.0
	for _, m := range r.px.Load.report(nil) {
		if m.Model == testModel {
			held = m.Held
		}
	}
	if held != float64(n) {
		t.Fatalf("the load report holds %v requests; want the %d waiting in the queue", held, n)
	}
	for k := 1; k <= n; k++ {
		room.mu.Lock()
		room.tokens++
		room.mu.Unlock()
		waitFor(t, fmt.Sprintf("dispatch %d", k), func() bool { return len(room.dispatched()) == k })
	}
	wg.Wait()
	got := room.dispatched()
	if want := []int{40, 41, 30, 31}; !slicesEqual(got[:4], want) {
		t.Fatalf("dispatch order %v; want the critical requests, then the standard ones, first: %v", got, want)
	}
	a, b := 0, 0
	lastA, lastB := 9, 19
	for i, out := range got[4:] {
		switch {
		case out >= 10 && out < 20:
			a++
			if out != lastA+1 {
				t.Fatalf("tenant shed-a's requests out of order: %v", got)
			}
			lastA = out
		case out >= 20 && out < 30:
			b++
			if out != lastB+1 {
				t.Fatalf("tenant shed-b's requests out of order: %v", got)
			}
			lastB = out
		}
		if a-b > 1 || b-a > 1 {
			t.Fatalf("after %d sheddable dispatches, %d of shed-a's and %d of shed-b's: %v; want them by turns", i+1, a, b, got)
		}
	}
	for _, ans := range answers {
		if ans.code != 200 {
			t.Errorf("%s's request %d answered %d", ans.key, ans.out, ans.code)
		}
	}
	if w := waiting(); w != 0 || len(answers) != n {
		t.Fatalf("%v still waiting, %d of %d answered", w, len(answers), n)
	}
	// The client waited in the queue too: the router's latency counts it.
	waited, latency := r.counter(t, "arbiter_router_queue_wait_seconds_sum"), r.counter(t, "arbiter_router_e2e_request_latency_seconds_sum")
	if waited <= 0 || latency < waited {
		t.Fatalf("requests waited %.3f s in the queue, and their latency adds up to %.3f s; want the wait counted in it", waited, latency)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With queue.engine_priority each request reaches its replica with its band as vLLM's
// priority field, the client's own replaced. Against a replica without priority scheduling
// (vLLM's default), which refuses any priority but 0, that shows what was sent: a critical
// request's 0 passes, even where the client wrote -5; a sheddable one's 2 is vLLM's 400. A
// replica with --scheduling-policy priority takes both.
func TestEnginePriorityGivesTheBandAsVLLMsPriority(t *testing.T) {
	keys := "keys: [{name: app, key: " + appKey + ", priority: critical}, {name: batch, key: " + batchKey + ", priority: sheddable}]"
	ask := func(r *rig, key, extra string) (int, string) {
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, extra), "Authorization", "Bearer "+key)
		return resp.StatusCode, body
	}
	on := func(c *Config) { c.Queue.EnginePriority = true }
	fcfs := keyedRouter(t, startSim(t, simOpts{}), keys, on)
	if code, body := ask(fcfs, appKey, `,"priority":-5`); code != 200 {
		t.Errorf("critical, the client's priority -5 replaced by 0, at an fcfs replica: HTTP %d %s", code, body)
	}
	if code, body := ask(fcfs, batchKey, ""); code != 400 || !strings.Contains(body, "Got priority 2 but Priority scheduling is not enabled.") {
		t.Errorf("sheddable at an fcfs replica: HTTP %d %s; want vLLM's 400 for priority 2", code, body)
	}
	prio := keyedRouter(t, startSim(t, simOpts{priority: true}), keys, on)
	for _, k := range []string{appKey, batchKey} {
		if code, body := ask(prio, k, ""); code != 200 {
			t.Errorf("at a priority-scheduling replica: HTTP %d %s", code, body)
		}
	}
	// Off, the body goes as the client wrote it: no priority, or the client's.
	off := keyedRouter(t, startSim(t, simOpts{}), keys, nil)
	if code, body := ask(off, batchKey, ""); code != 200 {
		t.Errorf("engine_priority off, sheddable: HTTP %d %s", code, body)
	}
	if code, _ := ask(off, appKey, `,"priority":-5`); code != 400 {
		t.Errorf("engine_priority off, the client's priority -5 at an fcfs replica: HTTP %d; want vLLM's 400", code)
	}
}

// A service's own tenant bands (arbiter.tenants, published by the control plane) outrank the
// keys file's for its requests, all the way to the engine: with the service's
// engine_priority and a replica that refuses any priority but 0 (vLLM's fcfs), the key that
// is sheddable in the keys file but critical in the service is served (priority 0), and the
// one that is critical in the keys file but sheddable in the service gets vLLM's 400 for
// priority 2.
func TestServiceTenantBandsReachTheEngine(t *testing.T) {
	s := startSim(t, simOpts{})
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel},
		Queue:   &fleet.Queue{MaxWaitSeconds: 30, SheddableFill: 1, EnginePriority: true},
		Tenants: []fleet.TenantBand{{Name: "nightly", Priority: "critical"}, {Name: "app", Priority: "sheddable"}},
	}}, []fleet.Replica{replica("a", s, fleet.Reserved, 0)})
	r, _ := startWithControlPlane(t, fake, nil)
	ks, err := ParseKeys([]byte("keys: [{name: app, key: "+appKey+", priority: critical}, {name: batch, key: "+batchKey+", tenant: nightly, priority: sheddable}]"), "")
	if err != nil {
		t.Fatal(err)
	}
	r.px.SetKeys(ks)
	waitFor(t, "the replica routed", func() bool { return len(r.pool.candidates(testModel)) == 1 })
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+batchKey); resp.StatusCode != 200 {
		t.Errorf("nightly, critical on the service: HTTP %d %s", resp.StatusCode, body)
	}
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+appKey); resp.StatusCode != 400 || !strings.Contains(body, "Got priority 2") {
		t.Errorf("app, sheddable on the service: HTTP %d %s; want vLLM's 400 for priority 2", resp.StatusCode, body)
	}
}

// A request the queue refuses for want of room is reported as shed, with the tokens it would
// have had, for the autoscaler to count as demand; a request answered is not.
func TestShedRequestsReportedToTheAutoscaler(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	room := &roomPolicy{}
	r := keyedRouter(t, s, "keys: [{name: batch, key: "+batchKey+", priority: sheddable}]", func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWait = 300 * time.Millisecond
		c.SLOs = map[string]SLO{"*": {TTFT: 60, TPOT: 1}}
	})
	r.px.policies["room"] = room
	resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+batchKey, "X-Arbiter-Policy", "room")
	if resp.StatusCode != 429 {
		t.Fatalf("no room: HTTP %d %s; want 429 at max_wait", resp.StatusCode, body)
	}
	report := func() fleet.ModelLoad {
		for _, m := range r.px.Load.report(nil) {
			if m.Model == testModel {
				return m
			}
		}
		return fleet.ModelLoad{}
	}
	if m := report(); m.Shed != 1 || m.ShedTokens < 5 || m.Requests != 1 {
		t.Fatalf("report after one refusal: %+v; want 1 request, 1 shed with its prompt and 5 output tokens", m)
	}
	room.mu.Lock()
	room.tokens = 1
	room.mu.Unlock()
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+batchKey, "X-Arbiter-Policy", "room"); resp.StatusCode != 200 {
		t.Fatalf("with room: HTTP %d %s", resp.StatusCode, body)
	}
	if m := report(); m.Shed != 0 || m.ShedTokens != 0 || m.Requests != 1 {
		t.Fatalf("report after one served: %+v; want 1 request, none shed (the counts restart at each report)", m)
	}
}

// The splice that gives the engine a request's band: the object's last key, whatever the
// body's end looks like, and valid JSON whose last "priority" is the band.
func TestWithPrioritySplicesTheLastKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"model":"m"}`, `{"model":"m","priority":2}`},
		{"{\"model\":\"m\"}\n", "{\"model\":\"m\",\"priority\":2}\n"},
		{`{ "model":"m" , "priority":-100 }`, `{ "model":"m" , "priority":-100 ,"priority":2}`},
		{`{}`, `{"priority":2}`},
		{"{ \n}", "{ \n\"priority\":2}"},
	} {
		if got := string(withPriority([]byte(c.in), Sheddable)); got != c.want {
			t.Errorf("withPriority(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Through the endpoint picker too, the body the gateway sends on carries the band: a
// gateway's request is no way around the key's ceiling in the engine.
func TestPickerGivesTheBandAsVLLMsPriority(t *testing.T) {
	r := keyedRouter(t, startSim(t, simOpts{}), "keys: [{name: batch, key: "+batchKey+", priority: sheddable}]", func(c *Config) { c.Queue.EnginePriority = true })
	in := HandoffRequest{Method: http.MethodPost, Path: "/v1/chat/completions", ContentType: "application/json",
		Header: func(h string) []byte {
			if strings.EqualFold(h, "Authorization") {
				return []byte("Bearer " + batchKey)
			}
			return nil
		},
		Body: []byte(chatBody(false, `,"priority":-100`))}
	h, f := r.px.Handoff(in)
	if f != nil {
		t.Fatalf("pick refused: %+v", f)
	}
	defer h.Close()
	if !strings.HasSuffix(string(h.Body()), `,"priority":2}`) {
		t.Errorf("body sent on %s; want the sheddable band's priority 2 last", h.Body())
	}
}

// sendAsync posts a one-message chat request of max_tokens out as the key, through the
// named policy, and returns a channel that receives its status code (0: no answer).
func sendAsync(url, key, policy string, out int, stream bool) chan int {
	code := make(chan int, 1)
	go func() {
		body := fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"stream":%v}`, testModel, out, stream)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			code <- 0
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Arbiter-Policy", policy)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			code <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	return code
}

// wantOKWithin fails the test unless the request whose status code comes on code (what)
// is answered 200 within the time given (else late says what did not happen).
func wantOKWithin(t *testing.T, code chan int, within time.Duration, what, late string) {
	t.Helper()
	select {
	case got := <-code:
		if got != 200 {
			t.Fatalf("%s answered %d", what, got)
		}
	case <-time.After(within):
		t.Fatal(late)
	}
}

// racePolicy has room for a gated request only while open > 0. An ungated pick (a
// request going over the gate) of the request whose max_tokens is noOver finds nothing;
// of the one whose max_tokens is blockOut, once armAt has passed, it waits, the first
// time, until release is closed, having said so on entered.
type racePolicy struct {
	mu       sync.Mutex
	open     int
	noOver   int
	blockOut int
	// gateBlockOut: the gated pick of the request whose max_tokens it is waits the same
	// way (once, on entered and release).
	gateBlockOut int
	armAt        time.Time
	blocked      bool
	entered      chan struct{}
	release      chan struct{}
}

func (p *racePolicy) gates() {}

func (p *racePolicy) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if len(cands) == 0 {
		return nil
	}
	p.mu.Lock()
	if req.gate > 0 {
		if req.OutTokens == p.gateBlockOut && !p.blocked {
			p.blocked = true
			p.mu.Unlock()
			close(p.entered)
			<-p.release
			p.mu.Lock()
		}
		defer p.mu.Unlock()
		if p.open == 0 {
			return nil
		}
		p.open--
		return cands[0]
	}
	if req.OutTokens == p.noOver {
		p.mu.Unlock()
		return nil
	}
	block := req.OutTokens == p.blockOut && !p.blocked && !p.armAt.IsZero() && !time.Now().Before(p.armAt)
	p.blocked = p.blocked || block
	p.mu.Unlock()
	if block {
		close(p.entered)
		<-p.release
	}
	return cands[0]
}

func (p *racePolicy) set(f func(*racePolicy)) {
	p.mu.Lock()
	f(p)
	p.mu.Unlock()
}

// A waiter that is not the head may go over the gate (a critical request near its
// target while sheddable work holds the room); if the head's turn passed to it while it
// was picking (the head left at its target), its leaving must pass the turn on. It did
// not: the queue's turn stayed with a request no longer in it, and every later waiter
// waited for a turn that never came (the bench's stalled queue+prio run of 2026-11-30:
// the batch tenant refused at max_wait for the whole run, the fleet nearly idle).
func TestQueueTurnPassesOnWhenAWaiterGoesOverTheGate(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 50 * time.Millisecond})
	const keys = `keys:
  - {name: crit, key: sk-crit-0123456789abcdef, priority: critical}
  - {name: shed, key: sk-shed-0123456789abcdef, priority: sheddable}
`
	pol := &racePolicy{noOver: 1, blockOut: 2, entered: make(chan struct{}), release: make(chan struct{})}
	r := keyedRouter(t, s, keys, func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWait = 15 * time.Second
		c.SLOs = map[string]SLO{"*": {TTFT: 1, TPOT: 1}}
	})
	r.px.policies["race"] = pol
	waiting := func() float64 { return r.counter(t, "arbiter_router_queue_waiting_requests") }
	send := func(key string, out int, stream bool) chan int { return sendAsync(r.url, key, "race", out, stream) }
	// Batch work holds the room (through its gate), streaming for 10 s.
	pol.set(func(p *racePolicy) { p.open = 1 })
	send("sk-shed-0123456789abcdef", 200, true)
	waitFor(t, "the batch request sent", func() bool { pol.mu.Lock(); defer pol.mu.Unlock(); return pol.open == 0 })
	// Two critical requests wait for room. The first, the head, never goes over the gate
	// and leaves at its 1 s target; the second, near its own, is inside its pick over the
	// gate then, and the turn passes to it.
	first := send("sk-crit-0123456789abcdef", 1, false)
	waitFor(t, "the first critical request waiting", func() bool { return waiting() == 1 })
	pol.set(func(p *racePolicy) { p.armAt = time.Now().Add(700 * time.Millisecond) })
	second := send("sk-crit-0123456789abcdef", 2, false)
	select {
	case <-pol.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the second critical request never tried to go over the gate")
	}
	if got := <-first; got != 429 {
		t.Fatalf("the first critical request answered %d; want 429 at its target", got)
	}
	waitFor(t, "the turn passed to the second", func() bool {
		for _, sq := range r.px.queues.byName {
			sq.mu.Lock()
			passed := sq.trying != nil && sq.q.n == 1
			sq.mu.Unlock()
			if passed {
				return true
			}
		}
		return false
	})
	close(pol.release)
	if got := <-second; got != 200 {
		t.Fatalf("the second critical request answered %d; want 200 (over the gate)", got)
	}
	// Batch work arrives with no room, then room opens: it must get its turn.
	later := send("sk-shed-0123456789abcdef", 1, false)
	waitFor(t, "a batch request waiting", func() bool { return waiting() == 1 })
	pol.set(func(p *racePolicy) { p.open = 1 })
	wantOKWithin(t, later, 5*time.Second, "the waiting batch request", "room opened 5 s ago and the waiting batch request was not sent: the queue's turn was lost")
}

// Whatever path takes the waiter whose turn it is out of the queue, the next kick gives
// the turn to the head.
func TestQueueTurnOfAWaiterGoneIsNoOnes(t *testing.T) {
	var sq serviceQueue
	a := &waiter{tenant: "t", band: Critical, weight: 1, turn: make(chan struct{}, 1)}
	b := &waiter{tenant: "t", band: Critical, weight: 1, turn: make(chan struct{}, 1)}
	for _, w := range []*waiter{a, b} {
		if _, ok := sq.q.push(w, false); !ok {
			t.Fatal("push refused")
		}
	}
	sq.kick()
	if sq.trying != a {
		t.Fatalf("the turn went to %p; want the head %p", sq.trying, a)
	}
	sq.q.remove(a) // gone without passing the turn on
	sq.kick()
	select {
	case <-b.turn:
	default:
		t.Fatal("the head was not given the turn a waiter no longer queued held")
	}
}

// idlePolicy has room for a gated request only on a replica with nothing in flight; a
// request that is not gated goes to the first candidate. Its lateLook-th gated pick of
// the request whose max_tokens is lateOut looks before the replica's request has left it
// (as a pick racing the end of a request can): it sees the replica busy, and returns
// only once the replica is idle, with nothing.
type idlePolicy struct {
	mu       sync.Mutex
	lateOut  int
	lateLook int
	looks    int
}

func (p *idlePolicy) gates() {}

func (p *idlePolicy) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if req.gate > 0 && req.OutTokens == p.lateOut {
		p.mu.Lock()
		p.looks++
		late := p.looks == p.lateLook
		p.mu.Unlock()
		if late {
			for _, r := range cands {
				for r.InFlight() > 0 {
					time.Sleep(time.Millisecond)
				}
			}
			return nil
		}
	}
	for _, r := range cands {
		if req.gate == 0 || r.InFlight() == 0 {
			return r
		}
	}
	return nil
}

// The room a request frees is taken as soon as its replica's model lets it go, not at the
// next poll. The queue's kick at the answer's settling comes before the replica's End (the
// replica's model learns from the answer first): a head that looked in between saw the
// replica busy and waited for an event that never came (here the poll is an hour, so
// only a kick can send it).
func TestQueueRoomFreedAtTheEndIsTakenAtOnce(t *testing.T) {
	s := startSim(t, simOpts{})
	ks, err := ParseKeys([]byte("keys:\n  - {name: shed, key: sk-shed-0123456789abcdef, priority: sheddable}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	// The waiting request looks at its arrival, again at its turn on joining the queue,
	// then at the first request's settling: that one looks late.
	pol := &idlePolicy{lateOut: 1, lateLook: 3}
	r := startRouterWith(t, func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWait = 20 * time.Second
	}, func(px *Proxy, _ *Pool) {
		px.SetKeys(ks)
		px.queuePoll = time.Hour
		px.policies["idle"] = pol
	}, replica("a", s, fleet.Reserved, 0))
	send := func(out int) chan int { return sendAsync(r.url, "sk-shed-0123456789abcdef", "idle", out, false) }
	first := send(300) // about two seconds of decoding
	waitFor(t, "the first request on the replica", func() bool { return r.pool.Get("a").InFlight() == 1 })
	second := send(1)
	waitFor(t, "the second request waiting", func() bool { return r.counter(t, "arbiter_router_queue_waiting_requests") == 1 })
	if got := <-first; got != 200 {
		t.Fatalf("first request %d", got)
	}
	wantOKWithin(t, second, 10*time.Second, "the waiting request", "the replica has been free for 10 s and the waiting request was not sent")
}

// A waiter shed from a full queue while it picked, that found room, goes; the slot it
// held went to the request that shed it, so it does not give it back a second time (the
// count of waiting requests went one below the truth each time, loosening max_waiting).
func TestQueueShedWhilePickingKeepsTheCount(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	const keys = `keys:
  - {name: crit, key: sk-crit-0123456789abcdef, priority: critical}
  - {name: shed, key: sk-shed-0123456789abcdef, priority: sheddable}
`
	pol := &racePolicy{noOver: 4, entered: make(chan struct{}), release: make(chan struct{})}
	r := keyedRouter(t, s, keys, func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWaiting = 1
		c.Queue.MaxWait = 20 * time.Second
		c.SLOs = map[string]SLO{"*": {TTFT: 20, TPOT: 1}}
	})
	r.px.policies["race"] = pol
	waiting := func() float64 { return r.counter(t, "arbiter_router_queue_waiting_requests") }
	send := func(key string, out int) chan int { return sendAsync(r.url, key, "race", out, false) }
	shed := send("sk-shed-0123456789abcdef", 3)
	waitFor(t, "the sheddable request waiting", func() bool { return waiting() == 1 })
	pol.set(func(p *racePolicy) { p.gateBlockOut = 3 })
	select {
	case <-pol.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the sheddable request never looked for room again")
	}
	crit := send("sk-crit-0123456789abcdef", 4) // the queue is full: it sheds the sheddable one
	waitFor(t, "the critical request waiting in the sheddable one's place", func() bool {
		r.px.queues.mu.Lock()
		defer r.px.queues.mu.Unlock()
		return r.px.queues.waiting == 1 && len(r.px.queues.byName) == 1 && func() bool {
			for _, sq := range r.px.queues.byName {
				sq.mu.Lock()
				defer sq.mu.Unlock()
				return sq.q.n == 1 && sq.q.bands[Critical].flows != nil
			}
			return false
		}()
	})
	pol.set(func(p *racePolicy) { p.open = 1 })
	close(pol.release) // the shed request's pick finds the room
	if got := <-shed; got != 200 {
		t.Fatalf("the request shed while it found room answered %d; want it sent", got)
	}
	r.px.queues.mu.Lock()
	n := r.px.queues.waiting
	r.px.queues.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d requests counted waiting while the critical one waits; want 1", n)
	}
	pol.set(func(p *racePolicy) { p.open = 1 })
	if got := <-crit; got != 200 {
		t.Fatalf("the critical request answered %d", got)
	}
	r.px.queues.mu.Lock()
	n = r.px.queues.waiting
	r.px.queues.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d requests counted waiting with none waiting; want 0", n)
	}
}

// A kick that comes while the head picks (room may have opened after its pick looked)
// is not lost: if the pick finds no room, the head looks again.
func TestQueueKickDuringAPickIsNotLost(t *testing.T) {
	var sq serviceQueue
	a := &waiter{tenant: "t", band: Standard, weight: 1, turn: make(chan struct{}, 1)}
	if _, ok := sq.q.push(a, false); !ok {
		t.Fatal("push refused")
	}
	sq.kick()
	<-a.turn  // a picks, the lock released
	sq.kick() // a request ends meanwhile
	sq.mu.Lock()
	sq.endTurnLocked(a) // a's pick found no room
	sq.mu.Unlock()
	select {
	case <-a.turn:
	default:
		t.Fatal("the kick that came during the pick was lost: the head waits for the next event")
	}
	if sq.trying != a {
		t.Fatalf("the turn is with %p; want the head %p", sq.trying, a)
	}
}

// panicPolicy finds no room on its first gated pick (the request queues) and panics on
// its second (the request's turn in the queue).
type panicPolicy struct{ looks atomic.Int32 }

func (p *panicPolicy) gates() {}

func (p *panicPolicy) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if req.gate > 0 {
		if p.looks.Add(1) == 2 {
			panic("a policy's bug")
		}
		return nil
	}
	return nil
}

// A request whose pick panics while it waits (the router answers it 500 and lives on)
// leaves the queue: its slot and its turn go on to the next.
func TestQueuePanicInAPickLeavesTheQueue(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	const keys = `keys:
  - {name: shed, key: sk-shed-0123456789abcdef, priority: sheddable}
`
	room := &racePolicy{entered: make(chan struct{}), release: make(chan struct{})}
	pan := &panicPolicy{}
	r := keyedRouter(t, s, keys, func(c *Config) {
		c.Queue.Enabled = true
		c.Queue.MaxWaiting = 1
		c.Queue.MaxWait = 20 * time.Second
	})
	r.px.policies["room"], r.px.policies["panic"] = room, pan
	send := func(policy string) chan int { return sendAsync(r.url, "sk-shed-0123456789abcdef", policy, 1, false) }
	if got := <-send("panic"); got != 500 {
		t.Fatalf("the request whose pick panicked answered %d; want 500", got)
	}
	next := send("room") // no room: it must find the one slot free and the turn its own
	waitFor(t, "the next request waiting", func() bool { return r.counter(t, "arbiter_router_queue_waiting_requests") == 1 })
	room.set(func(p *racePolicy) { p.open = 1 })
	wantOKWithin(t, next, 10*time.Second, "the next request", "room opened 10 s ago and the next request was not sent")
}
