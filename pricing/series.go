package pricing

import (
	"math"
	"slices"
	"time"
)

// stamp is a time in Unix seconds. Every source logs whole seconds, and integer
// comparisons keep replay lookups cheap (Quote looks up thousands of lines).
type stamp int64

const (
	undated stamp = math.MinInt64 // an undated snapshot: before every time
	latest  stamp = math.MaxInt64 // after every log: the zero time asked of Offers/Quote
)

func stampOf(t time.Time) stamp {
	if t.IsZero() {
		return undated
	}
	return stamp(t.Unix())
}

func (s stamp) time() time.Time {
	if s == undated || s == latest {
		return time.Time{}
	}
	return time.Unix(int64(s), 0).UTC()
}

// utcDay numbers the UTC day holding s.
func (s stamp) utcDay() int64 {
	d := int64(s) / 86400
	if int64(s)%86400 < 0 {
		d--
	}
	return d
}

// state is what a source knows about one price at one time. The difference between
// blank and unknown matters where two sources overlap: a source that lists a machine
// without a spot price has spoken (no spot offer); one that does not list it at all
// leaves the answer to the next source.
type state uint8

const (
	unknown state = iota // the source does not list the machine at that time
	blank                // listed, without a price for this capacity
	priced
)

// sample is one price as a source gives it.
type sample struct {
	usd float64
	// observed is when the source first showed this price; undated for a snapshot.
	observed stamp
	source   string
}

// pricer gives the price of one line of a catalog at a time.
type pricer interface {
	at(t stamp) (sample, state)
	// ever reports whether the pricer gives a price at some time; one that never does
	// (Lambda's and Vast's empty spot columns) becomes no line at all.
	ever() bool
}

// point is one event of a change log: from at on, the price is usd (when st is priced).
type point struct {
	at  stamp
	usd float64
	st  state
}

// series is a price replayed from a change log: the last point at or before t holds.
type series struct {
	source string
	pts    []point // sorted by at
	// backfill: before its first point the series holds that point's value. Set when
	// the key was already listed when its log began, since nothing earlier is known and
	// the first price is the best answer; a key that appeared later did not exist before.
	backfill bool
}

func (s *series) at(t stamp) (sample, state) {
	// The last point with at ≤ t; most series have a handful of points.
	lo, hi := 0, len(s.pts)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.pts[m].at <= t {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 {
		if !s.backfill || len(s.pts) == 0 {
			return sample{}, unknown
		}
		i = 0
	}
	p := s.pts[i]
	return sample{usd: p.usd, observed: p.at, source: s.source}, p.st
}

func (s *series) ever() bool {
	return slices.ContainsFunc(s.pts, func(p point) bool { return p.st == priced })
}

// noBackfill is s holding only from its first point on.
func (s *series) noBackfill() *series {
	c := *s
	c.backfill = false
	return &c
}

// constant is a snapshot price with no date: it holds at every time.
func constant(source string, usd float64) *series {
	return &series{source: source, pts: []point{{at: undated, usd: usd, st: priced}}, backfill: true}
}

// overlay prefers first wherever first lists the machine, and falls back to second only
// where first does not know it. It joins a better source to a wider one.
type overlay struct{ first, second pricer }

func (o overlay) ever() bool { return o.first.ever() || o.second.ever() }

func (o overlay) at(t stamp) (sample, state) {
	if s, st := o.first.at(t); st != unknown {
		return s, st
	}
	return o.second.at(t)
}

// sum is a machine whose price a source splits in two: GCP's host VM and its GPUs.
type sum struct {
	a, b   pricer
	source string
}

func (s sum) ever() bool { return s.a.ever() && s.b.ever() }

func (s sum) at(t stamp) (sample, state) {
	x, xs := s.a.at(t)
	y, ys := s.b.at(t)
	switch {
	case xs == unknown || ys == unknown:
		return sample{}, unknown
	case xs == blank || ys == blank:
		return sample{}, blank
	}
	// Rounding to 1e-9 USD only drops float noise from the addition (2.6538899999999997).
	return sample{usd: math.Round((x.usd+y.usd)*1e9) / 1e9, observed: max(x.observed, y.observed), source: s.source}, priced
}

// dailyMedian smooths a series that flips between values within a day. The anycloud
// README warns that its Azure rows do (NC24ads_A100_v4 eastus on-demand 3.673 ↔ 4.777
// several times a day, sometimes blank, likely different retail meters) and suggests a
// daily median. commits are the times the source was observed, sorted. For each UTC day
// with observations the result holds, from that day's first observation on, the lower
// median of the prices in force at that day's observations: a value the source really
// gave, never an average of two. A key gone at the day's last observation is gone.
func dailyMedian(s *series, commits []stamp) *series {
	out := &series{source: s.source, backfill: s.backfill}
	var prices []float64
	for start := 0; start < len(commits); {
		end := start + 1
		for end < len(commits) && commits[end].utcDay() == commits[start].utcDay() {
			end++
		}
		day := commits[start:end]
		start = end
		prices = prices[:0]
		for _, c := range day {
			if smp, st := s.at(c); st == priced {
				prices = append(prices, smp.usd)
			}
		}
		p := point{at: day[0]}
		switch _, last := s.at(day[len(day)-1]); {
		case last == unknown:
			p.st = unknown
		case len(prices) == 0:
			p.st = blank
		default:
			slices.Sort(prices)
			p.usd, p.st = prices[(len(prices)-1)/2], priced
		}
		// Days before the key first appeared add nothing; equal neighbours merge, so
		// that PricedSince stays when the smoothed price took effect.
		if n := len(out.pts); (n == 0 && p.st == unknown) || (n > 0 && out.pts[n-1].st == p.st && out.pts[n-1].usd == p.usd) {
			continue
		}
		out.pts = append(out.pts, p)
	}
	if len(out.pts) > 0 && len(s.pts) > 0 && out.pts[0].at < s.pts[0].at {
		// A key first listed late in a day must not exist from that day's first observation.
		out.pts[0].at = s.pts[0].at
	}
	return out
}
