// Package workload replays the shared LLM request traces against an OpenAI endpoint the way
// the benchmarks in bench/ need it: prompts whose shared prefixes follow the trace, open-loop
// arrivals time-scaled to a rate, and per-request timings of streamed answers as the client
// sees them (with the router's routing headers when it sends them).
package workload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/traces"
)

// Load returns a named trace tiled over a day, prompts and outputs clamped to the bounds
// (outputs of at least 2 tokens, so every request has a time per output token).
func Load(name string, maxPrompt, maxOutput int) ([]traces.Request, error) {
	tr, err := traces.NamedRequests(name)
	if err != nil {
		return nil, err
	}
	reqs := tr.Tile(24 * time.Hour)
	for i := range reqs {
		reqs[i].InputTokens = min(max(reqs[i].InputTokens, 1), maxPrompt)
		reqs[i].OutputTokens = min(max(reqs[i].OutputTokens, 2), maxOutput)
	}
	return reqs, nil
}

// Capacity is a profile's throughput (requests per second) for these requests: all of them
// queued at once and run to the end in virtual time, through the engine replicasim serves with.
func Capacity(p engine.Profile, reqs []traces.Request) (float64, error) {
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

// Prompt builds a text of about r.InputTokens tokens whose leading blocks (traces'
// MooncakeBlockTokens each) follow the trace's hash ids, so requests that share ids share a
// prompt prefix, as the trace's conversations do. Words are common English ones, one BPE
// token each, as replicasim counts.
func Prompt(r traces.Request) string {
	var b strings.Builder
	words := 0
	for i := 0; words < r.InputTokens; i++ {
		id := uint64(i)<<32 | uint64(r.At)
		if i < len(r.PrefixBlocks) {
			id = r.PrefixBlocks[i]
		}
		for j := 0; j < traces.MooncakeBlockTokens && words < r.InputTokens; j++ {
			b.WriteString(vocabulary[(id*2654435761+uint64(j)*40503)%uint64(len(vocabulary))])
			b.WriteByte(' ')
			words++
		}
	}
	return b.String()
}

// Result is one streamed request as the client saw it.
type Result struct {
	Start, End time.Time
	// Replica and the predictions come from the router's routing headers (empty and 0 if
	// it sent none).
	Replica            string
	PredTTFT, PredTPOT float64 // seconds
	TTFT, TPOT         float64 // seconds
	// SentTTFT is the TTFT from when the router sent the request (its routing header
	// X-Arbiter-Sent-Unix-Nano, same host), what its prediction is of; 0 without it.
	SentTTFT       float64
	Prompt, Output int // tokens, from the usage chunk
	// Cached is the prompt tokens the replica's prefix cache served (usage's
	// prompt_tokens_details, when the replica reports it); PredUncached the prompt tokens
	// the router predicted it would compute (X-Arbiter-Predicted-Uncached).
	Cached, PredUncached int
	Err                  error
}

// Replay sends the requests open-loop to url (an OpenAI base such as http://host:port): the
// trace's own arrival pattern, time-scaled to rate requests per second, arrivals bounded by
// maxDuration. It returns one result per request sent, failures included.
func Replay(client *http.Client, url, model string, reqs []traces.Request, rate float64, maxDuration time.Duration) []Result {
	return replay(client, url, func(int) string { return model }, reqs, rate, maxDuration, func(_ traces.Request, i int) uint64 { return uint64(i) })
}

// ReplayModels is Replay with each request's own model: models[i] is reqs[i]'s (a LoRA
// adapter's name, say).
func ReplayModels(client *http.Client, url string, models []string, reqs []traces.Request, rate float64, maxDuration time.Duration) []Result {
	return replay(client, url, func(i int) string { return models[i] }, reqs, rate, maxDuration, func(_ traces.Request, i int) uint64 { return uint64(i) })
}

// timeScale is the factor that turns the requests' trace times into times at which they
// arrive at rate per second on average.
func timeScale(reqs []traces.Request, rate float64) float64 {
	span := (reqs[len(reqs)-1].At - reqs[0].At).Seconds()
	if span <= 0 {
		return 1
	}
	return float64(len(reqs)-1) / rate / span
}

// ReplaySessions is Replay for conversations: requests that share a conversation key (see
// Conversations) are one user's turns, each sent only after the answer to the one before
// it, at its time-scaled trace time or, if the previous answer came later, right then, as a
// user does. First turns follow the trace's pattern scaled to rate, as Replay's do.
func ReplaySessions(client *http.Client, url, model string, reqs []traces.Request, rate float64, maxDuration time.Duration) []Result {
	return replay(client, url, func(int) string { return model }, reqs, rate, maxDuration, conversationKey)
}

// replay sends the requests at their time-scaled trace times, those with the same key one
// after the other (each after the answer to the one before it, never before its time).
func replay(client *http.Client, url string, modelOf func(i int) string, reqs []traces.Request, rate float64, maxDuration time.Duration,
	key func(r traces.Request, i int) uint64) []Result {
	scale := timeScale(reqs, rate)
	sessions := map[uint64][]int{}
	var order []uint64
	for i, r := range reqs {
		k := key(r, i)
		if _, ok := sessions[k]; !ok {
			order = append(order, k)
		}
		sessions[k] = append(sessions[k], i)
	}
	var (
		mu  sync.Mutex
		out []Result
		wg  sync.WaitGroup
	)
	start := time.Now()
	for _, k := range order {
		turns := sessions[k]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range turns {
				r := reqs[i]
				at := time.Duration(float64(r.At-reqs[0].At) * scale)
				if at > maxDuration {
					return
				}
				time.Sleep(time.Until(start.Add(at)))
				res := Stream(client, url, modelOf(i), r)
				mu.Lock()
				out = append(out, res)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// conversationKey names a request's conversation: its second prefix block (Mooncake's
// prompts all start with the same system block), or, without prefix ids, one of its own
// from i, its index.
func conversationKey(r traces.Request, i int) uint64 {
	if len(r.PrefixBlocks) == 0 {
		return uint64(1)<<63 | uint64(i)
	}
	return r.PrefixBlocks[min(1, len(r.PrefixBlocks)-1)]
}

// Stream sends one chat request, streamed with usage, and times it.
func Stream(client *http.Client, url, model string, r traces.Request) Result {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "stream_options": map[string]bool{"include_usage": true},
		"max_tokens": r.OutputTokens, "messages": []map[string]string{{"role": "user", "content": Prompt(r)}},
	})
	res := Result{Start: time.Now()}
	fail := func(err error) Result {
		res.End, res.Err = time.Now(), err
		return res
	}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fail(fmt.Errorf("status %d: %s", resp.StatusCode, b))
	}
	res.Replica = resp.Header.Get("X-Arbiter-Replica")
	res.PredTTFT, _ = strconv.ParseFloat(resp.Header.Get("X-Arbiter-Predicted-Ttft-Ms"), 64)
	res.PredTPOT, _ = strconv.ParseFloat(resp.Header.Get("X-Arbiter-Predicted-Tpot-Ms"), 64)
	res.PredTTFT, res.PredTPOT = res.PredTTFT/1000, res.PredTPOT/1000
	sentNano, _ := strconv.ParseInt(resp.Header.Get("X-Arbiter-Sent-Unix-Nano"), 10, 64)
	res.PredUncached, _ = strconv.Atoi(resp.Header.Get("X-Arbiter-Predicted-Uncached"))
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
				Details    *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(line[len("data: "):], &ev); err != nil {
			return fail(fmt.Errorf("bad event %q: %w", line, err))
		}
		if ev.Error != nil {
			return fail(fmt.Errorf("stream failed: %s", ev.Error))
		}
		if len(ev.Choices) > 0 && first.IsZero() {
			first = time.Now()
		}
		if ev.Usage != nil {
			res.Prompt, res.Output = ev.Usage.Prompt, ev.Usage.Completion
			if ev.Usage.Details != nil {
				res.Cached = ev.Usage.Details.Cached
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fail(err)
	}
	res.End = time.Now()
	if first.IsZero() || res.Output == 0 {
		return fail(fmt.Errorf("no first token or no usage"))
	}
	res.TTFT = first.Sub(res.Start).Seconds()
	if sentNano > 0 {
		res.SentTTFT = first.Sub(time.Unix(0, sentNano)).Seconds()
	}
	if res.Output > 1 {
		res.TPOT = res.End.Sub(first).Seconds() / float64(res.Output-1)
	}
	return res
}

// Tally is a run's results added up: those that succeeded (OK), those of them within the
// SLO (Good), their tokens, TTFTs and TPOTs, each replica's, and the run's first start and
// last end.
type Tally struct {
	OK, Good, Tokens int
	TTFT, TPOT       []float64
	PerReplica       map[string][]Result
	First, Last      time.Time
}

// Count adds up res against an SLO of ttft and tpot, and writes the first three failures to
// stderr under label.
func Count(label string, res []Result, ttft, tpot time.Duration) Tally {
	t := Tally{PerReplica: map[string][]Result{}}
	fails := 0
	for _, r := range res {
		if t.First.IsZero() || r.Start.Before(t.First) {
			t.First = r.Start
		}
		if r.End.After(t.Last) {
			t.Last = r.End
		}
		if r.Err != nil {
			if fails++; fails <= 3 {
				fmt.Fprintf(os.Stderr, "%s: request failed: %v\n", label, r.Err)
			}
			continue
		}
		t.OK++
		t.Tokens += r.Prompt + r.Output
		t.TTFT, t.TPOT = append(t.TTFT, r.TTFT), append(t.TPOT, r.TPOT)
		if r.TTFT <= ttft.Seconds() && r.TPOT <= tpot.Seconds() {
			t.Good++
		}
		t.PerReplica[r.Replica] = append(t.PerReplica[r.Replica], r)
	}
	return t
}

// Quantile is the q-quantile of xs (NaN when empty); xs is not changed.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// Ms formats seconds as whole milliseconds ("—" for NaN).
func Ms(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return strconv.FormatFloat(x*1000, 'f', 0, 64) + " ms"
}

// Pct formats a fraction as a percentage ("—" for NaN).
func Pct(x float64) string {
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

// Conversations picks n requests that keep the trace's multi-turn structure within a short
// run: requests are grouped by their second prefix block (in Mooncake's traces every prompt
// starts with the same system block; the next one names the conversation), whole groups are taken in order of first appearance
// until n requests, and the result keeps the trace's order. A time window of the same size
// would hold few follow-up turns, which come minutes apart. Requests without prefix ids
// (Azure's traces) are taken as they come.
func Conversations(reqs []traces.Request, n int) []traces.Request {
	groups := map[uint64][]int{}
	var order []uint64
	var plain []int
	for i, r := range reqs {
		if len(r.PrefixBlocks) == 0 {
			if len(plain) < n {
				plain = append(plain, i)
			}
			continue
		}
		k := conversationKey(r, i)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	if len(order) == 0 {
		return pick(reqs, plain)
	}
	var idx []int
	for _, k := range order {
		if len(idx) >= n {
			break
		}
		idx = append(idx, groups[k]...)
	}
	slices.Sort(idx)
	return pick(reqs, idx[:min(n, len(idx))])
}

func pick(reqs []traces.Request, idx []int) []traces.Request {
	out := make([]traces.Request, len(idx))
	for i, j := range idx {
		out[i] = reqs[j]
	}
	return out
}

// CreateCSV creates a per-request dump at path with its header row; done flushes and closes
// it, and says whether any row failed to be written.
func CreateCSV(path string, header ...string) (w *csv.Writer, done func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	w = csv.NewWriter(f)
	_ = w.Write(header)
	return w, func() error {
		w.Flush()
		return errors.Join(w.Error(), f.Close())
	}, nil
}
