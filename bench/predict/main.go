// Command predict measures how well the router's latency predictions match what replicas
// do. It replays a shared request trace (Mooncake's conversations, or Azure's) through the
// real router, over HTTP on loopback, to replicasim replicas of different GPU profiles, at
// several load levels, and compares each streamed request's predicted TTFT and TPOT (the
// router's routing headers: X-Arbiter-Predicted-Ttft-Ms / -Tpot-Ms) with what the client
// saw. It prints, per level and per replica profile, the mean absolute percentage error
// (MAPE), the 90th percentile of the absolute percentage error, and the share of SLO
// verdicts (predicted to meet or miss the TTFT SLO) that were right.
//
// Load levels are fractions of the pool's capacity for the trace, found by running the
// trace's first requests through each profile's engine in virtual time (the same model
// replicasim serves with). Arrivals keep the trace's own pattern, time-scaled to the level's
// rate. Every run is bounded in requests and time.
//
//	go run ./bench/predict -trace mooncake-conversation-30min -levels 0.05,0.5,0.9,1.3
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicasim"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/traces"
)

const model = "predict-model"

type options struct {
	trace       string
	profiles    []string
	levels      []float64
	perLevel    int
	maxDuration time.Duration
	sloTTFT     time.Duration
	maxPrompt   int
	maxOutput   int
	tokenizer   string
}

func main() {
	var o options
	var profiles, levels string
	flag.StringVar(&o.trace, "trace", "mooncake-conversation-30min", "request trace: "+strings.Join(traces.RequestNames(), ", "))
	flag.StringVar(&profiles, "profiles", "h100-llama-3.1-8b,h200-llama-3.1-8b", "one replica per profile (a mixed pool): "+strings.Join(engine.ProfileNames(), ", "))
	flag.StringVar(&levels, "levels", "0.05,0.5,0.9,1.3", "load levels as fractions of the pool's capacity for the trace")
	flag.IntVar(&o.perLevel, "requests", 300, "requests per level")
	flag.DurationVar(&o.maxDuration, "max-duration", 90*time.Second, "bound on each level's arrivals")
	flag.DurationVar(&o.sloTTFT, "slo-ttft", time.Second, "the TTFT SLO whose verdicts are scored")
	flag.IntVar(&o.maxPrompt, "max-prompt", 16000, "prompts longer than this are cut (tokens)")
	flag.IntVar(&o.maxOutput, "max-output", 400, "outputs longer than this are cut (tokens), to bound the run")
	flag.StringVar(&o.tokenizer, "tokenizer", "approx", "the router's prompt token counter: approx (its default) or bpe (what replicasim counts with)")
	flag.Parse()
	o.profiles = strings.Split(profiles, ",")
	for _, l := range strings.Split(levels, ",") {
		f, err := strconv.ParseFloat(l, 64)
		if err != nil || f <= 0 {
			fail(fmt.Errorf("-levels %q: want positive fractions", levels))
		}
		o.levels = append(o.levels, f)
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "predict:", err)
	os.Exit(1)
}

// sample is one streamed request as the client saw it and as the router predicted it.
type sample struct {
	replica                  string
	predTTFT, predTPOT       float64 // seconds
	ttft, tpot               float64 // seconds
	promptTokens, outputToks int
}

func run(o options) error {
	tr, err := traces.NamedRequests(o.trace)
	if err != nil {
		return err
	}
	reqs := tr.Tile(24 * time.Hour)
	for i := range reqs {
		reqs[i].InputTokens = min(max(reqs[i].InputTokens, 1), o.maxPrompt)
		reqs[i].OutputTokens = min(max(reqs[i].OutputTokens, 2), o.maxOutput)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var set []fleet.Replica
	profileOf := map[string]string{}
	capacity := 0.0
	for i, name := range o.profiles {
		p, err := engine.LoadProfile(name)
		if err != nil {
			return err
		}
		c, err := capacityOf(*p, reqs[:min(len(reqs), 200)])
		if err != nil {
			return err
		}
		capacity += c
		addr, err := startReplica(ctx, p)
		if err != nil {
			return err
		}
		id := fmt.Sprintf("r%d-%s", i, name)
		profileOf[id] = name
		set = append(set, fleet.Replica{ID: id, Address: addr, Model: model, Capacity: fleet.OnDemand, PricePerHour: 4})
		fmt.Fprintf(os.Stderr, "replica %s at %s: %.2f req/s of this trace at capacity\n", id, addr, c)
	}
	url, err := startRouter(ctx, set, o.sloTTFT, o.tokenizer)
	if err != nil {
		return err
	}
	fmt.Printf("trace %s, replicas %s, TTFT SLO %v, router tokenizer %s, pool capacity %.2f req/s (virtual-time engine replay)\n\n",
		o.trace, strings.Join(o.profiles, " + "), o.sloTTFT, o.tokenizer, capacity)
	fmt.Println("| load (of capacity) | replica profile | requests | observed TTFT p50 / p90 | predicted TTFT p50 / p90 | TTFT MAPE | TTFT APE p90 | TPOT MAPE | SLO verdicts right |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	next := 0
	for _, level := range o.levels {
		rate := level * capacity
		batch := reqs[next : next+o.perLevel]
		next += o.perLevel
		samples, failed := replay(url, batch, rate, o.maxDuration)
		byProfile := map[string][]sample{}
		for _, s := range samples {
			byProfile[profileOf[s.replica]] = append(byProfile[profileOf[s.replica]], s)
		}
		names := slices.Sorted(maps.Keys(byProfile))
		for _, name := range append(names, "all") {
			ss := byProfile[name]
			if name == "all" {
				ss = samples
			}
			fmt.Printf("| %.2f (%.2f req/s) | %s | %d%s | %s | %s | %s | %s | %s | %s |\n", level, rate, name, len(ss), failedNote(name, failed),
				pair(ss, func(s sample) float64 { return s.ttft }), pair(ss, func(s sample) float64 { return s.predTTFT }),
				pct(mape(ss, func(s sample) (float64, float64) { return s.predTTFT, s.ttft })),
				pct(apeQuantile(ss, 0.9, func(s sample) (float64, float64) { return s.predTTFT, s.ttft })),
				pct(mape(ss, func(s sample) (float64, float64) { return s.predTPOT, s.tpot })),
				pct(verdicts(ss, o.sloTTFT.Seconds())))
		}
		// Let the replicas drain before the next level.
		time.Sleep(2 * time.Second)
	}
	return nil
}

func failedNote(name string, failed int) string {
	if name != "all" || failed == 0 {
		return ""
	}
	return fmt.Sprintf(" (+%d failed)", failed)
}

// capacityOf is the profile's throughput (requests per second) for these requests: all of
// them queued at once and run to the end in virtual time.
func capacityOf(p engine.Profile, reqs []traces.Request) (float64, error) {
	eng, err := engine.New(p)
	if err != nil {
		return 0, err
	}
	for i, r := range reqs {
		if err := eng.Add(engine.Request{ID: uint64(i + 1), PromptTokens: r.InputTokens, MaxTokens: r.OutputTokens}); err != nil {
			return 0, fmt.Errorf("capacity of %s: %w", p.Name, err)
		}
	}
	var total time.Duration
	for !eng.Idle() {
		total += eng.Step().Duration
	}
	return float64(len(reqs)) / total.Seconds(), nil
}

func startReplica(ctx context.Context, p *engine.Profile) (string, error) {
	srv, err := replicasim.New(replicasim.Config{Model: model, Profile: p, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go srv.Run(ctx)
	go func() { _ = srv.Serve(ctx, ln) }()
	return ln.Addr().String(), nil
}

func startRouter(ctx context.Context, set []fleet.Replica, slo time.Duration, tokenizer string) (string, error) {
	cfg := router.Defaults()
	cfg.Tokenizer = tokenizer
	cfg.SLOs = map[string]router.SLO{"*": {TTFT: slo.Seconds()}}
	cfg.RoutingHeaders = true
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	log := slog.New(slog.DiscardHandler)
	met := router.NewMetrics(prometheus.NewRegistry())
	aff, err := router.NewAffinity(cfg.AffinitySize, 64)
	if err != nil {
		return "", err
	}
	pool := router.NewPool(&cfg, log, met, aff)
	if err := fleet.ValidateSet(set); err != nil {
		return "", err
	}
	pool.SetReplicas(set)
	px, err := router.NewProxy(&cfg, pool, met, log)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := router.NewServer(&cfg, px.Handle, log)
	go func() { _ = srv.Serve(ln) }()
	go pool.Run(ctx)
	go func() { <-ctx.Done(); _ = srv.Shutdown() }()
	// Let the first probes measure every replica's round trip.
	time.Sleep(500 * time.Millisecond)
	return "http://" + ln.Addr().String(), nil
}

// replay sends the requests open-loop: the trace's own arrival pattern, scaled to rate.
func replay(url string, reqs []traces.Request, rate float64, maxDuration time.Duration) ([]sample, int) {
	span := (reqs[len(reqs)-1].At - reqs[0].At).Seconds()
	scale := 1.0
	if span > 0 {
		scale = float64(len(reqs)-1) / rate / span
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 10 * time.Minute}
	var (
		mu      sync.Mutex
		samples []sample
		failed  int
		wg      sync.WaitGroup
	)
	start := time.Now()
	for _, r := range reqs {
		at := time.Duration(float64(r.At-reqs[0].At) * scale)
		if at > maxDuration {
			break
		}
		time.Sleep(time.Until(start.Add(at)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := send(client, url, r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				fmt.Fprintln(os.Stderr, "request:", err)
				return
			}
			samples = append(samples, s)
		}()
	}
	wg.Wait()
	return samples, failed
}

// prompt builds a text of about n tokens whose leading 512-token blocks follow the trace's
// hash ids, so requests that share ids share a prompt prefix (for the prefix caches).
func prompt(r traces.Request) string {
	var b strings.Builder
	words := 0
	for i := 0; words < r.InputTokens; i++ {
		id := uint64(i)<<32 | uint64(r.At)
		if i < len(r.PrefixBlocks) {
			id = r.PrefixBlocks[i]
		}
		for j := 0; j < traces.MooncakeBlockTokens && words < r.InputTokens; j++ {
			// Common English words: one token each for the BPE tokenizer replicasim counts
			// with, as a real prompt's words mostly are.
			b.WriteString(vocabulary[(id*2654435761+uint64(j)*40503)%uint64(len(vocabulary))])
			b.WriteByte(' ')
			words++
		}
	}
	return b.String()
}

func send(client *http.Client, url string, r traces.Request) (sample, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "stream_options": map[string]bool{"include_usage": true},
		"max_tokens": r.OutputTokens, "messages": []map[string]string{{"role": "user", "content": prompt(r)}},
	})
	start := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return sample{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	s := sample{replica: resp.Header.Get("X-Arbiter-Replica")}
	s.predTTFT, _ = strconv.ParseFloat(resp.Header.Get("X-Arbiter-Predicted-Ttft-Ms"), 64)
	s.predTPOT, _ = strconv.ParseFloat(resp.Header.Get("X-Arbiter-Predicted-Tpot-Ms"), 64)
	s.predTTFT, s.predTPOT = s.predTTFT/1000, s.predTPOT/1000
	var first time.Time
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line, []byte("data: [DONE]")) {
			continue
		}
		var ev struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(line[len("data: "):], &ev); err != nil {
			return sample{}, fmt.Errorf("bad event %q: %w", line, err)
		}
		if len(ev.Choices) > 0 && first.IsZero() {
			first = time.Now()
		}
		if ev.Usage != nil {
			s.promptTokens, s.outputToks = ev.Usage.Prompt, ev.Usage.Completion
		}
	}
	if err := sc.Err(); err != nil {
		return sample{}, err
	}
	end := time.Now()
	if first.IsZero() || s.replica == "" {
		return sample{}, fmt.Errorf("no first token or no routing header")
	}
	s.ttft = first.Sub(start).Seconds()
	if s.outputToks > 1 {
		s.tpot = end.Sub(first).Seconds() / float64(s.outputToks-1)
	}
	return s, nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func pair(ss []sample, f func(sample) float64) string {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, f(s))
	}
	return fmt.Sprintf("%s / %s", secs(quantile(xs, 0.5)), secs(quantile(xs, 0.9)))
}

func secs(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return strconv.FormatFloat(x*1000, 'f', 0, 64) + " ms"
}

func apes(ss []sample, f func(sample) (pred, obs float64)) []float64 {
	var out []float64
	for _, s := range ss {
		if p, o := f(s); o > 0 {
			out = append(out, math.Abs(p-o)/o)
		}
	}
	return out
}

func mape(ss []sample, f func(sample) (float64, float64)) float64 {
	xs := apes(ss, f)
	if len(xs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func apeQuantile(ss []sample, q float64, f func(sample) (float64, float64)) float64 {
	return quantile(apes(ss, f), q)
}

func verdicts(ss []sample, slo float64) float64 {
	if len(ss) == 0 {
		return math.NaN()
	}
	right := 0
	for _, s := range ss {
		if (s.predTTFT <= slo) == (s.ttft <= slo) {
			right++
		}
	}
	return float64(right) / float64(len(ss))
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return strconv.FormatFloat(x*100, 'f', 1, 64) + " %"
}

// vocabulary is common English words, each a single BPE token.
var vocabulary = strings.Fields(`the of and to in is was for on that with as by at from his her they
have had not are but this which were one all their there been has when who will more would no out
time so can about said what up its into than them only other some could new these two may first
then do any like my now over such our man me even most made after also did many before must
through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being
under never day same another know while last might us great old year off come since against go
came right used take three house use during without again place around however home small found
thought went say part once general high upon school every does got left number course war until
always away something fact water though less public put think almost hand enough far took head
yet government system better set told nothing night end why called didn look find going asked
later point knew city next program business give group toward days young let room president side
social given present several order national second possible rather per face among form important
often things early`)
