package control

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// The control plane keeps a window of each service's request mix as the routers report it
// (fleet.ModelLoad.Mix): the last mixWindow, in one-minute slots, so that an hour-old burst
// of long prompts no longer decides which GPU is cheapest per token.
const (
	mixWindow = 15 * time.Minute
	mixSlot   = time.Minute
	// mixMinSpan is the shortest time rates are taken over: the first report alone says
	// little about a rate.
	mixMinSpan = 10 * time.Second
	// minMixRequests is how many requests the window must hold before the observed mix
	// replaces the spec's arbiter.workload (or the default) in sizing each GPU.
	minMixRequests = 100
	// maxSustainClasses bounds how many classes each GPU's throughput is computed for
	// (each a simulation of some tenths of a second, remembered): the busiest classes, the
	// rest folded into one.
	maxSustainClasses = 4
)

type mixCount struct{ requests, prompt, output float64 }

// requestMix is one service's window of request counts by length class.
type requestMix struct {
	since time.Time // the first report with a mix
	slots [mixWindow / mixSlot]struct {
		start time.Time
		cells map[[2]int]mixCount
	}
}

// add counts one router's report of cells at now.
func (m *requestMix) add(now time.Time, cells []fleet.MixCell) {
	if len(cells) == 0 {
		return
	}
	if m.since.IsZero() {
		m.since = now
	}
	start := now.Truncate(mixSlot)
	sl := &m.slots[start.Unix()/int64(mixSlot/time.Second)%int64(len(m.slots))]
	if !sl.start.Equal(start) {
		sl.start, sl.cells = start, map[[2]int]mixCount{}
	}
	for _, c := range cells {
		k := [2]int{c.Prompt, c.Output}
		v := sl.cells[k]
		v.requests += c.Requests
		v.prompt += c.PromptTokens
		v.output += c.OutputTokens
		sl.cells[k] = v
	}
}

// classes is the mix over the window at now: one class per length class that saw requests,
// with its mean lengths and rate, sorted by length; and how many requests the window holds.
func (m *requestMix) classes(now time.Time) ([]scaling.MixClass, float64) {
	if m == nil || m.since.IsZero() {
		return nil, 0
	}
	oldest := now.Truncate(mixSlot).Add(-mixWindow + mixSlot)
	sum := map[[2]int]mixCount{}
	for _, sl := range m.slots {
		if sl.start.Before(oldest) || sl.start.After(now) {
			continue
		}
		for k, v := range sl.cells {
			s := sum[k]
			s.requests += v.requests
			s.prompt += v.prompt
			s.output += v.output
			sum[k] = s
		}
	}
	span := now.Sub(maxTime(m.since, oldest))
	span = min(max(span, mixMinSpan), mixWindow)
	var out []scaling.MixClass
	total := 0.0
	for _, v := range sum {
		if v.requests <= 0 {
			continue
		}
		total += v.requests
		out = append(out, scaling.MixClass{In: int(math.Round(v.prompt / v.requests)), Out: int(math.Round(v.output / v.requests)), Rate: v.requests / span.Seconds()})
	}
	slices.SortFunc(out, func(a, b scaling.MixClass) int { return cmp.Or(cmp.Compare(a.In, b.In), cmp.Compare(a.Out, b.Out)) })
	return out, total
}

// recent is the rate of requests a second over the last d (at least a slot): the level
// the GPU mix is sized for, while the window's classes give its shape.
func (m *requestMix) recent(now time.Time, d time.Duration) float64 {
	if m == nil || m.since.IsZero() {
		return 0
	}
	from := now.Add(-max(d, mixSlot)).Truncate(mixSlot)
	n := 0.0
	for _, sl := range m.slots {
		if sl.start.Before(from) || sl.start.After(now) {
			continue
		}
		for _, v := range sl.cells {
			n += v.requests
		}
	}
	span := now.Sub(maxTime(m.since, from))
	return n / max(span, mixMinSpan).Seconds()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Mix is the request mix the routers reported for a service over the last 15 minutes: one
// class per prompt and output length class that saw requests (fleet.MixPromptBounds ×
// fleet.MixOutputBounds), each with its requests' mean lengths and their rate a second,
// sorted by length. Nil for a service with no reported traffic in the window, or none
// of that name.
func (c *Controller) Mix(service string) []scaling.MixClass {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.services[service]
	if !ok {
		return nil
	}
	return s.observedMix(c.cfg.Now())
}

// observedMix is Mix for code that holds c.mu already (the tick).
func (s *service) observedMix(now time.Time) []scaling.MixClass {
	cls, _ := s.mix.classes(now)
	return cls
}

// sizingMix is the mix each GPU's throughput is computed for: what the routers observed,
// once the window holds minMixRequests; before that the spec's arbiter.workload; else the
// default (1,024 prompt and 256 output tokens). what says which, for reasons.
func sizingMix(sp *spec.Service, observed []scaling.MixClass, requests float64) (mix []scaling.MixClass, what string) {
	if requests >= minMixRequests && len(observed) > 0 {
		return observed, fmt.Sprintf("the observed mix (%.0f requests: %s)", requests, describeMix(observed))
	}
	if w := sp.Arbiter.Workload; w.PromptTokens > 0 && w.OutputTokens > 0 {
		return []scaling.MixClass{{In: w.PromptTokens, Out: w.OutputTokens, Rate: 1}}, fmt.Sprintf("arbiter.workload %d:%d tokens", w.PromptTokens, w.OutputTokens)
	}
	return []scaling.MixClass{{In: defaultMixIn, Out: defaultMixOut, Rate: 1}}, fmt.Sprintf("%d:%d tokens", defaultMixIn, defaultMixOut)
}

// describeMix says a mix's busiest classes and their shares: "62% 100:50, 38% 3000:300".
func describeMix(mix []scaling.MixClass) string {
	total := 0.0
	for _, c := range mix {
		total += c.Rate
	}
	byRate := slices.SortedStableFunc(slices.Values(mix), func(a, b scaling.MixClass) int { return cmp.Compare(b.Rate, a.Rate) })
	var parts []string
	for i, c := range byRate {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%d more", len(byRate)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%.0f%% %d:%d", 100*c.Rate/total, c.In, c.Out))
	}
	return strings.Join(parts, ", ")
}

// foldMix keeps the busiest maxSustainClasses-1 classes of mix and folds the rest into one
// class of their mean lengths and summed rate.
func foldMix(mix []scaling.MixClass) []scaling.MixClass {
	if len(mix) <= maxSustainClasses {
		return mix
	}
	byRate := slices.SortedStableFunc(slices.Values(mix), func(a, b scaling.MixClass) int { return cmp.Compare(b.Rate, a.Rate) })
	out := slices.Clone(byRate[:maxSustainClasses-1])
	var rate, in, o float64
	for _, c := range byRate[maxSustainClasses-1:] {
		rate += c.Rate
		in += c.Rate * float64(c.In)
		o += c.Rate * float64(c.Out)
	}
	return append(out, scaling.MixClass{In: int(math.Round(in / rate)), Out: int(math.Round(o / rate)), Rate: rate})
}
