// Command policies compares the router's policies on the same replicas and the same traffic:
// real `replicasim` processes of two GPU profiles at two price tiers, the real `router`
// process in front of them, and open-loop arrivals from a shared trace, all over HTTP on
// loopback. Each policy gets fresh replicas (empty prefix caches) and a fresh router, and the
// same requests at the same times.
//
// Per policy it reports the share of requests that succeeded, SLO attainment (succeeded with
// TTFT and TPOT within the SLO, over all requests), goodput (such requests per second of
// the run), TTFT p50/p90, TPOT p90, what the tokens cost, and each replica's share of requests.
//
// Cost is "busy-time" cost: each replica's hourly price times the time it had at least one
// request in flight, over the tokens answered. The replica set is the same for every policy,
// so what the whole set costs for the run is the same too; busy time is what a policy
// changes, and what an autoscaler turns into money by scaling idle replicas away.
//
//	go build -o bin/ ./cmd/router ./cmd/replicasim && go run ./bench/policies -bin bin
//
// With -via picker the same traffic goes through the router's endpoint picker instead
// (router -ext-proc-listen, asked by bench/gateway as a Kubernetes gateway would).
package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/arbiter-serve/arbiter/bench/gateway"
	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/bench/workload"
	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/traces"
)

const model = "policies-model"

type replicaSpec struct {
	profile string
	price   float64
}

type options struct {
	bin         string
	trace       string
	replicas    []replicaSpec
	policies    []string
	level       float64
	requests    int
	maxDuration time.Duration
	sloTTFT     time.Duration
	sloTPOT     time.Duration
	maxPrompt   int
	maxOutput   int
	// conversations samples whole conversations instead of a time window.
	conversations bool
	// dump, if set, is a CSV file that gets every request's routing and timings.
	dump string
	// via is the front door the traffic takes: "router" (its HTTP port) or "picker" (a
	// gateway stand-in asking the router's endpoint picker over ext_proc, bench/gateway).
	via string
	// pickers is how many routers serve the picker (-via picker), each with its own view of
	// the load, the gateway taking them in turn.
	pickers int
	// routers is how many routers serve the client port (-via router), a load balancer
	// taking them in turn, request by request.
	routers int
	// balanceFirst sends every request to the first router: the others run (probing,
	// scraping, gossiping) but route nothing, which tells what N routers cost the machine
	// from what splitting the traffic costs.
	balanceFirst bool
	// peerBatch is the routers' -peer-batch-window with /shared ("": theirs by default).
	peerBatch string
}

// fronts is how many routers the traffic goes through.
func (o options) fronts() int {
	if o.via == "picker" {
		return o.pickers
	}
	return o.routers
}

// parsePolicy splits a -policies entry: a policy, then /no-prefix (prefix affinity off)
// and /shared (the routers share their view: -peer-listen, -peers), in either order.
func parsePolicy(pol string) (policy string, noPrefix, shared bool, err error) {
	parts := strings.Split(pol, "/")
	for _, m := range parts[1:] {
		switch m {
		case "no-prefix":
			noPrefix = true
		case "shared":
			shared = true
		default:
			return "", false, false, fmt.Errorf("policy %q: unknown modifier /%s (want /no-prefix or /shared)", pol, m)
		}
	}
	return parts[0], noPrefix, shared, nil
}

// defaultReplicas: two profiles at two price tiers, prices from the shared catalogs
// (pricing.Embedded, 2026-11): an H100 on Azure eastus as spot ($2.19/h) and on-demand
// ($6.98/h, Standard_NC40ads_H100_v5), an H200 on Vast ($2.35/h, 1x-H200), and a second
// on-demand H100, so the cheap tier holds both profiles and the dear tier half the pool.
const defaultReplicas = "h100-llama-3.1-8b@2.192,h200-llama-3.1-8b@2.35,h100-llama-3.1-8b@6.98,h100-llama-3.1-8b@6.98"

func main() {
	var o options
	var reps, pols string
	flag.StringVar(&o.bin, "bin", "bin", "folder holding the router and replicasim binaries")
	flag.StringVar(&o.trace, "trace", "mooncake-conversation-30min", "request trace: "+strings.Join(traces.RequestNames(), ", "))
	flag.StringVar(&reps, "replicas", defaultReplicas, "replicas as profile@USD-per-hour, comma-separated")
	flag.StringVar(&pols, "policies", "slo_cheapest,slo_cheapest/no-prefix,least_load,round_robin", "policies to compare; /no-prefix turns prefix affinity off, /shared has the routers (or pickers) share their view of the fleet")
	flag.Float64Var(&o.level, "level", 0.6, "load as a fraction of the pool's capacity for the trace")
	flag.IntVar(&o.requests, "requests", 300, "requests per policy")
	flag.DurationVar(&o.maxDuration, "max-duration", 90*time.Second, "bound on each run's arrivals")
	flag.DurationVar(&o.sloTTFT, "slo-ttft", time.Second, "TTFT SLO")
	flag.DurationVar(&o.sloTPOT, "slo-tpot", 100*time.Millisecond, "TPOT SLO")
	flag.IntVar(&o.maxPrompt, "max-prompt", 16000, "prompts longer than this are cut (tokens)")
	flag.IntVar(&o.maxOutput, "max-output", 300, "outputs longer than this are cut (tokens), to bound the run")
	flag.BoolVar(&o.conversations, "conversations", true, "sample whole conversations (requests grouped by their conversation's prefix block) rather than the trace's first requests, so follow-up turns fall within the run; each turn is sent after the answer to the one before")
	flag.StringVar(&o.via, "via", "router", "front door: router (its HTTP port) or picker (a gateway stand-in asking the same router's endpoint picker over Envoy ext_proc, as a Kubernetes gateway with GIE does)")
	flag.IntVar(&o.pickers, "pickers", 1, "with -via picker: how many pickers (routers with -ext-proc-listen, each its own view of the load) the gateway takes in turn")
	flag.StringVar(&o.peerBatch, "peer-batch-window", "", "with /shared: the routers' -peer-batch-window (default: theirs)")
	flag.BoolVar(&o.balanceFirst, "balance-first", false, "with -routers N: the balancer sends everything to the first router, the others idle (a control: what N routers cost the machine, apart from splitting the traffic)")
	flag.IntVar(&o.routers, "routers", 1, "with -via router: how many routers, a load balancer stand-in taking them in turn request by request")
	flag.StringVar(&o.dump, "dump", "", "write every request (policy, replica, predicted and observed TTFT, tokens) to this CSV file")
	flag.Parse()
	for _, r := range strings.Split(reps, ",") {
		name, price, ok := strings.Cut(r, "@")
		p, err := strconv.ParseFloat(price, 64)
		if !ok || err != nil || p <= 0 {
			fail(fmt.Errorf("-replicas %q: want profile@price", r))
		}
		o.replicas = append(o.replicas, replicaSpec{profile: name, price: p})
	}
	o.policies = strings.Split(pols, ",")
	for _, p := range o.policies {
		if _, _, _, err := parsePolicy(p); err != nil {
			fail(err)
		}
	}
	if o.via != "router" && o.via != "picker" {
		fail(fmt.Errorf("-via %q: want router or picker", o.via))
	}
	if o.pickers < 1 || o.pickers > 1 && o.via != "picker" {
		fail(fmt.Errorf("-pickers %d: want 1, or more with -via picker", o.pickers))
	}
	if o.routers < 1 || o.routers > 1 && o.via != "router" {
		fail(fmt.Errorf("-routers %d: want 1, or more with -via router", o.routers))
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "policies:", err)
	os.Exit(1)
}

func run(o options) (err error) {
	reqs, err := workload.Load(o.trace, o.maxPrompt, o.maxOutput)
	if err != nil {
		return err
	}
	if o.conversations {
		reqs = workload.Conversations(reqs[:min(len(reqs), 20*o.requests)], o.requests)
	} else {
		reqs = reqs[:min(o.requests, len(reqs))]
	}
	capacity, tps := 0.0, map[string]float64{}
	meanTokens := 0.0
	for _, r := range reqs {
		meanTokens += float64(r.InputTokens+r.OutputTokens) / float64(len(reqs))
	}
	for _, rs := range o.replicas {
		p, err := engine.LoadProfile(rs.profile)
		if err != nil {
			return err
		}
		c, err := workload.Capacity(*p, reqs[:min(len(reqs), 200)])
		if err != nil {
			return err
		}
		capacity += c
		tps[rs.profile] = c * meanTokens // what the control plane would publish as tokens_per_second
	}
	rate := o.level * capacity
	fmt.Printf("trace %s (conversations: %v), %d requests at %.2f req/s (%.2f of the pool's %.2f req/s), SLO TTFT %v TPOT %v, replicas %v, via the %s\n\n",
		o.trace, o.conversations, len(reqs), rate, o.level, capacity, o.sloTTFT, o.sloTPOT, describe(o.replicas), o.via+map[bool]string{true: fmt.Sprintf(" (%d of them%s)", o.fronts(), map[bool]string{true: ", all traffic to the first"}[o.balanceFirst])}[o.fronts() > 1])
	fmt.Println("| policy | prefix affinity | view | succeeded | SLO attainment | goodput | TTFT p50 / p90 | TPOT p90 | TTFT MAPE | $/M tokens (busy time) | requests per replica |")
	fmt.Println("|---|---|---|---:|---:|---:|---|---:|---:|---:|---|")
	var dump *csv.Writer
	if o.dump != "" {
		var done func() error
		dump, done, err = workload.CreateCSV(o.dump, "policy", "start_s", "replica", "predicted_ttft_s", "ttft_s", "predicted_tpot_s", "tpot_s", "prompt_tokens", "output_tokens", "error")
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, done()) }()
	}
	for _, pol := range o.policies {
		res, ids, err := runPolicy(o, pol, reqs, rate, tps)
		if err != nil {
			return fmt.Errorf("%s: %w", pol, err)
		}
		fmt.Println(row(o, pol, res, ids))
		if dump != nil {
			t0 := res[0].Start
			for _, r := range res {
				t0 = minTime(t0, r.Start)
			}
			for _, r := range res {
				errText := ""
				if r.Err != nil {
					errText = r.Err.Error()
				}
				f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
				_ = dump.Write([]string{pol, f(r.Start.Sub(t0).Seconds()), r.Replica, f(r.PredTTFT), f(r.TTFT), f(r.PredTPOT), f(r.TPOT),
					strconv.Itoa(r.Prompt), strconv.Itoa(r.Output), errText})
			}
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func describe(rs []replicaSpec) string {
	var parts []string
	for i, r := range rs {
		parts = append(parts, fmt.Sprintf("r%d %s $%.2f/h", i, r.profile, r.price))
	}
	return strings.Join(parts, ", ")
}

// runPolicy starts fresh replicas and a router (or -pickers of them) for one policy, replays the requests and
// stops everything. It returns the results and the replica set.
func runPolicy(o options, pol string, reqs []traces.Request, rate float64, tps map[string]float64) ([]workload.Result, []fleet.Replica, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "policies-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	g := procs.NewGroup(ctx, o.bin)
	defer g.Stop()
	start := func(name string, args ...string) error { return g.Start(nil, name, args...) }
	var set []fleet.Replica
	for i, rs := range o.replicas {
		addr, err := procs.FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		if err := start("replicasim", "-listen", addr, "-model", model, "-profile", rs.profile, "-log-level", "warn"); err != nil {
			return nil, nil, err
		}
		set = append(set, fleet.Replica{ID: fmt.Sprintf("r%d", i), Address: addr, Model: model, Capacity: fleet.OnDemand,
			PricePerHour: rs.price, TokensPerSecond: math.Round(tps[rs.profile]), Profile: rs.profile})
	}
	// The router counts a listed replica available before its first probe, so start it
	// only once every replica answers /health (replicasim loads its vocabulary first).
	for _, rep := range set {
		if err := procs.WaitHealthy(rep.Address); err != nil {
			return nil, nil, err
		}
	}
	policy, noPrefix, shared, err := parsePolicy(pol)
	if err != nil {
		return nil, nil, err
	}
	cfg := map[string]any{
		"policy":          policy,
		"slos":            map[string]any{model: map[string]float64{"ttft_seconds": o.sloTTFT.Seconds(), "tpot_seconds": o.sloTPOT.Seconds()}},
		"routing_headers": true,
	}
	if noPrefix {
		cfg["affinity_size"] = 0
	}
	if err := procs.WriteYAML(dir, map[string]any{"router.yaml": cfg, "replicas.yaml": map[string]any{"replicas": set}}); err != nil {
		return nil, nil, err
	}
	var urls, extProcs, gossip []string
	if shared {
		for range o.fronts() {
			addr, err := procs.FreeAddr()
			if err != nil {
				return nil, nil, err
			}
			gossip = append(gossip, addr)
		}
	}
	for i := range o.fronts() {
		listen, err := procs.FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		admin, err := procs.FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		args := []string{"-listen", listen, "-admin", admin, "-config", filepath.Join(dir, "router.yaml"),
			"-replicas", filepath.Join(dir, "replicas.yaml"), "-log-level", "warn", "-id", fmt.Sprintf("router-%d", i)}
		urls = append(urls, "http://"+listen)
		if shared {
			args = append(args, "-peer-listen", gossip[i], "-peers", strings.Join(gossip, ","))
			if o.peerBatch != "" {
				args = append(args, "-peer-batch-window", o.peerBatch)
			}
		}
		if o.via == "picker" {
			extProc, err := procs.FreeAddr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, "-ext-proc-listen", extProc)
			extProcs = append(extProcs, extProc)
		}
		if err := start("router", args...); err != nil {
			return nil, nil, err
		}
		if err := waitReady(admin, len(set)); err != nil {
			return nil, nil, err
		}
	}
	if o.via == "picker" {
		ids := map[string]string{}
		for _, rep := range set {
			ids[rep.Address] = rep.ID
		}
		gw, err := gateway.New(extProcs, ids)
		if err != nil {
			return nil, nil, err
		}
		defer gw.Close()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		srv := &http.Server{Handler: gw}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		urls = []string{"http://" + ln.Addr().String()}
	}
	url := urls[0]
	var rt http.RoundTripper = &http.Transport{MaxIdleConnsPerHost: 1024}
	if len(urls) > 1 && !o.balanceFirst {
		rt = &roundRobin{next: rt, hosts: hostsOf(urls)}
	}
	client := &http.Client{Transport: rt, Timeout: 10 * time.Minute}
	if o.conversations {
		return workload.ReplaySessions(client, url, model, reqs, rate, o.maxDuration), set, nil
	}
	return workload.Replay(client, url, model, reqs, rate, o.maxDuration), set, nil
}

// waitReady waits until the router's admin view shows every replica available.
func waitReady(admin string, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + admin + "/replicas")
		if err == nil {
			var view []struct {
				Available bool `json:"available"`
			}
			err = jsonDecode(resp, &view)
			up := 0
			for _, v := range view {
				if v.Available {
					up++
				}
			}
			if err == nil && up == n {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("replicas not all available to the router within 60 s")
}

func row(o options, pol string, res []workload.Result, set []fleet.Replica) string {
	t := workload.Count(pol, res, o.sloTTFT, o.sloTPOT)
	cost := 0.0
	var shares []string
	for _, rep := range set {
		cost += rep.PricePerHour * busy(t.PerReplica[rep.ID]).Hours()
		shares = append(shares, fmt.Sprintf("%s %.0f%%", rep.ID, 100*float64(len(t.PerReplica[rep.ID]))/float64(max(t.OK, 1))))
	}
	n := float64(len(res))
	policy, noPrefix, shared, _ := parsePolicy(pol)
	prefix := "on"
	if noPrefix || policy != "slo_cheapest" {
		prefix = "off"
	}
	view := "one"
	if o.fronts() > 1 {
		view = map[bool]string{true: "shared", false: "each its own"}[shared]
	}
	return fmt.Sprintf("| %s | %s | %s | %.1f %% | %.1f %% | %.2f req/s | %s / %s | %s | %s | %.3f | %s |", policy, prefix, view,
		100*float64(t.OK)/n, 100*float64(t.Good)/n, float64(t.Good)/t.Last.Sub(t.First).Seconds(),
		workload.Ms(workload.Quantile(t.TTFT, 0.5)), workload.Ms(workload.Quantile(t.TTFT, 0.9)), workload.Ms(workload.Quantile(t.TPOT, 0.9)),
		ttftMAPE(res), cost/float64(max(t.Tokens, 1))*1e6, strings.Join(shares, ", "))
}

// busy is the length of the union of the requests' [start, end] intervals.
func busy(rs []workload.Result) time.Duration {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
	var total time.Duration
	var curStart, curEnd time.Time
	for i, r := range rs {
		switch {
		case i == 0:
			curStart, curEnd = r.Start, r.End
		case r.Start.After(curEnd):
			total += curEnd.Sub(curStart)
			curStart, curEnd = r.Start, r.End
		case r.End.After(curEnd):
			curEnd = r.End
		}
	}
	if len(rs) > 0 {
		total += curEnd.Sub(curStart)
	}
	return total
}

func jsonDecode(resp *http.Response, v any) error {
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// ttftMAPE is the mean absolute percentage error of the router's TTFT predictions over the
// answers that carried one (routing_headers), or "—".
func ttftMAPE(res []workload.Result) string {
	sum, n := 0.0, 0
	for _, r := range res {
		if r.Err == nil && r.PredTTFT > 0 && r.TTFT > 0 {
			sum += math.Abs(r.PredTTFT-r.TTFT) / r.TTFT
			n++
		}
	}
	if n == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f %%", 100*sum/float64(n))
}

// roundRobin is a load balancer stand-in in front of several routers: each request goes to
// the next, whatever its conversation (an L7 balancer without session affinity).
type roundRobin struct {
	next  http.RoundTripper
	hosts []string
	n     atomic.Uint64
}

func (rr *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Host = rr.hosts[(rr.n.Add(1)-1)%uint64(len(rr.hosts))]
	r.Host = r.URL.Host
	return rr.next.RoundTrip(r)
}

func hostsOf(urls []string) []string {
	var hs []string
	for _, u := range urls {
		hs = append(hs, strings.TrimPrefix(u, "http://"))
	}
	return hs
}
