//go:build !race

package router

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The flood below is a measurement in real time: the race detector slows the router's
// parsing of 8,000-token prompts until it, not the replica, is the bottleneck, and the
// replica never queues. The queue's concurrency is checked under the race detector by
// TestQueueOrdersBandsThenTenants.

// batch is the batch tenant's requests, sent at once.
const batch = 40

type floodResult struct {
	appTTFT       []time.Duration // the interactive tenant's streamed requests' first events
	appCodes      []int
	batchCodes    map[int]int
	batchNoRetry  int // 429s without a Retry-After
	queueRejected float64
}

// flood runs a batch tenant's burst of long prompts at one replica and, once it is
// under way, an interactive tenant's requests one after another.
func flood(t *testing.T, queue bool) floodResult {
	s := startSim(t, simOpts{})
	keys := "keys: [{name: app, key: " + appKey + ", priority: critical}, {name: batch, key: " + batchKey + ", priority: sheddable}]"
	r := keyedRouter(t, s, keys, func(c *Config) {
		c.SLOs = map[string]SLO{"*": {TTFT: 1, TPOT: 0.1, Percentile: 0.9}}
		c.Queue.Enabled = queue
		c.Queue.SheddableFill = 0.5
		c.Queue.MaxWait = 3 * time.Second
	})
	longPrompt := strings.Repeat("a batch job's long document ", 1200) // ~8,000 tokens

	res := floodResult{batchCodes: map[int]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range batch {
		wg.Go(func() {
			// Each its own document: a prompt the replica has cached costs no prefill.
			body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"document ` + strconv.Itoa(i) + `: ` + longPrompt + `"}],"max_tokens":128}`
			resp, _ := post(t, r.url+"/v1/chat/completions", body, "Authorization", "Bearer "+batchKey)
			mu.Lock()
			defer mu.Unlock()
			res.batchCodes[resp.StatusCode]++
			if resp.StatusCode == 429 {
				if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || n < 1 {
					res.batchNoRetry++
				}
			}
		})
	}
	// Half the batch requests have reached the router (sent on, or waiting in its queue)
	// before the interactive tenant asks: under the race detector the flood's senders are
	// slow, and the first requests' prefill must not be over before the flood is.
	waitWithin(t, 30*time.Second, "the batch tenant's flood in the router", func() bool { return r.px.Load.get(testModel).requests.Load() >= batch/2 })
	for i := range 8 {
		req, err := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chatBody(true, "")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+appKey)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.appCodes = append(res.appCodes, resp.StatusCode)
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Logf("interactive request %d: HTTP %d %s", i, resp.StatusCode, b)
		} else if _, at := readEvents(t, resp.Body); len(at) > 0 {
			res.appTTFT = append(res.appTTFT, at[0].Sub(start))
		}
		resp.Body.Close()
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	res.queueRejected = r.counter(t, "arbiter_router_queue_rejected_total")
	return res
}

func p90(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)*9+9)/10-1]
}

// A batch tenant floods one replica with long prompts while an interactive tenant asks
// short questions: with the queue on, the interactive requests go ahead of the batch
// job's (critical before sheddable) and meet their 1 s TTFT target, while the batch job
// fills the replica up to its SLO and every batch request beyond that is answered 429
// with Retry-After. Without the queue every batch request lands in the engine's queue,
// first come first served, and the interactive requests wait behind seconds of prefill.
func TestQueuePutsTheInteractiveTenantAheadOfAFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of long prompts at one replica")
	}
	on := flood(t, true)
	t.Logf("queue on: interactive TTFT p90 %v (all %v), codes %v; batch %v, %d 429s without Retry-After, %v queue rejections",
		p90(on.appTTFT), on.appTTFT, on.appCodes, on.batchCodes, on.batchNoRetry, on.queueRejected)
	off := flood(t, false)
	t.Logf("queue off: interactive TTFT p90 %v (all %v), codes %v; batch %v", p90(off.appTTFT), off.appTTFT, off.appCodes, off.batchCodes)
	for i, c := range on.appCodes {
		if c != 200 {
			t.Errorf("queue on: interactive request %d answered %d", i, c)
		}
	}
	if len(on.appTTFT) != 8 || len(off.appTTFT) != 8 {
		t.Fatalf("first events seen: %d with the queue, %d without; want 8 each", len(on.appTTFT), len(off.appTTFT))
	}
	if got := p90(on.appTTFT); got > time.Second {
		t.Errorf("queue on: the interactive tenant's TTFT p90 %v; want within its 1 s target", got)
	}
	if on.batchCodes[200] == 0 || on.batchCodes[200]+on.batchCodes[429] != batch || on.batchNoRetry > 0 {
		t.Errorf("queue on: batch answers %v (%d 429s without Retry-After); want some served, the rest 429 with Retry-After", on.batchCodes, on.batchNoRetry)
	}
	if float64(on.batchCodes[429]) != on.queueRejected {
		t.Errorf("queue on: %d batch 429s but %v counted in arbiter_router_queue_rejected_total", on.batchCodes[429], on.queueRejected)
	}
	if p90(off.appTTFT) < 2*p90(on.appTTFT) {
		t.Errorf("without the queue the interactive p90 is %v, with it %v: the flood did not saturate the replica, so the test shows nothing", p90(off.appTTFT), p90(on.appTTFT))
	}
}
