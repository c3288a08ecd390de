package router

import (
	"math"
	"time"
)

// ewma is an exponentially weighted mean that starts from a prior. The first observation
// replaces the prior outright: a guess should not outweigh the one measurement there is
// (a far replica's round trip learned over ten probes would be booked as prefill time by
// the requests in between).
type ewma struct {
	v     float64
	alpha float64
	n     int
}

func (e *ewma) observe(x float64) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return
	}
	if e.n == 0 {
		e.v = x
	} else {
		e.v += e.alpha * (x - e.v)
	}
	e.n++
}

// linfit is an online least-squares line y = a + b·x with exponential forgetting. Until it
// has seen enough spread in x it keeps the prior slope and only moves the intercept.
type linfit struct {
	alpha                float64
	mx, my, mxx, mxy     float64
	n                    int
	priorA, priorB, minB float64
}

func (l *linfit) observe(x, y float64) { l.observeWeighted(x, y, l.alpha) }

// observeWeighted gives this observation weight a (at least the line's alpha).
func (l *linfit) observeWeighted(x, y, a float64) {
	if math.IsNaN(y) || math.IsInf(y, 0) || y < 0 {
		return
	}
	a = math.Max(a, l.alpha)
	if l.n == 0 {
		l.mx, l.my, l.mxx, l.mxy = x, y, x*x, x*y
	} else {
		l.mx += a * (x - l.mx)
		l.my += a * (y - l.my)
		l.mxx += a * (x*x - l.mxx)
		l.mxy += a * (x*y - l.mxy)
	}
	l.n++
}

func (l *linfit) coeffs() (a, b float64) {
	if l.n < 3 {
		return l.priorA, l.priorB
	}
	b = l.priorB
	if v := l.mxx - l.mx*l.mx; v > 1e-9*math.Max(1, l.mxx) {
		b = math.Max((l.mxy-l.mx*l.my)/v, l.minB)
	}
	a = math.Max(l.my-b*l.mx, 0)
	return a, b
}

func (l *linfit) predict(x float64) float64 {
	a, b := l.coeffs()
	return a + b*x
}

// predictor learns one replica's latency online. Priors are an 8B model on an H100
// (engine profile h100-llama-3.1-8b), so a fresh replica gets sensible predictions.
type predictor struct {
	rtt     ewma    // seconds, from readiness probes
	prefill linfit  // TTFT minus RTT and queue wait (s) by uncached prompt tokens
	tpot    linfit  // time per output token (s) by batch size
	e2e     ewma    // seconds per request, for queue wait
	slots   maxHold // engine batch capacity, learned when a queue is seen
	// lastErr is the latest TTFT prediction error (measured − predicted), for metrics.
	lastErr float64
	// learnedAt is when the prefill and decode lines last learned from a request.
	learnedAt time.Time
}

// memory is how long what a replica's requests taught its predictor stays worth more than
// a new request's lesson: an observation after a silence of d weighs 1 − e^(−d/memory)
// against everything before it (at least the lines' own alpha). Under steady traffic the
// lines average over many requests; a replica that was seen slow (a congested link, a
// noisy neighbour) and then left alone is judged by its next answer, not by its old ones.
const memory = 10 * time.Second

// weight is a new observation's weight at now.
func (p *predictor) weight(now time.Time) float64 {
	if p.learnedAt.IsZero() || !now.After(p.learnedAt) {
		return 0
	}
	return -math.Expm1(-float64(now.Sub(p.learnedAt)) / float64(memory))
}

// maxHold tracks a maximum that slowly decays towards new observations.
type maxHold struct{ v, prior float64 }

func (m *maxHold) observe(x float64) {
	if x > m.v || m.v == m.prior {
		m.v = x
		return
	}
	m.v += 0.05 * (x - m.v)
}

func newPredictor() predictor {
	return predictor{
		rtt:     ewma{v: 0.001, alpha: 0.2},
		prefill: linfit{alpha: 0.05, priorA: 0.010, priorB: 27e-6, minB: 0},
		tpot:    linfit{alpha: 0.05, priorA: 0.010, priorB: 40e-6, minB: 0},
		e2e:     ewma{v: 2, alpha: 0.05},
		slots:   maxHold{v: 256, prior: 256},
	}
}

// measurement is what the router saw of one finished request.
type measurement struct {
	uncached      int     // prompt tokens predicted uncached on this replica
	outTokens     int     // completion tokens
	ttft          float64 // seconds from sending to the first response byte / token
	e2e           float64 // seconds
	loadAtStart   float64 // predicted engine load when it was sent
	predictedTTFT float64
	queueWait     float64 // predicted queue wait when it was sent
	prefillWait   float64 // predicted prefill of the prompts ahead when it was sent
	streamed      bool    // ttft is a real first token, not the whole response
}

func (p *predictor) queueWait(load float64) float64 {
	slots := math.Max(p.slots.v, 1)
	if load+1 <= slots {
		return 0
	}
	// Requests ahead beyond the batch leave at the batch's completion rate.
	return (load + 1 - slots) / slots * p.e2e.v
}

// predict is the one prediction of a request's latency on the replica: load is the requests
// in its engine besides this one, aheadWait the prefill work (seconds) queued ahead of it.
func (p *predictor) predict(load float64, uncached int, aheadWait float64, outTokens int) Prediction {
	qw := p.queueWait(load)
	// Waiting for a batch slot and waiting for the prompts ahead to be prefilled overlap:
	// the prompts ahead are the ones taking the slots. The longer wait is the bottleneck.
	ttft := p.rtt.v + math.Max(qw, aheadWait) + p.prefill.predict(float64(uncached))
	batch := math.Min(load+1, math.Max(p.slots.v, 1))
	tpot := p.tpot.predict(batch)
	return Prediction{TTFT: ttft, TPOT: tpot, E2E: ttft + float64(max(outTokens-1, 0))*tpot, QueueWait: qw, PrefillWait: aheadWait, Load: load,
		Uncached: uncached, prefillWork: p.prefillWork(uncached)}
}

// prefillWork is the time a prompt's uncached tokens keep the replica's prefill busy. The
// chunked-prefill scheduler computes prompts in order, so this is what each delays the
// next by: the marginal rate (the line's slope), not the fixed cost of a step.
func (p *predictor) prefillWork(uncached int) float64 {
	_, b := p.prefill.coeffs()
	return b * float64(uncached)
}

func (p *predictor) learn(now time.Time, m measurement) {
	p.e2e.observe(m.e2e)
	if m.streamed {
		w := p.weight(now)
		p.lastErr = m.ttft - m.predictedTTFT
		// What the waits predicted for this request did not explain is its own prefill. When
		// they over-explain it, its prefill was quick, not unobserved: a lesson dropped for
		// being negative would leave only the slow ones, and the line (which also prices the
		// prefill queued ahead of later requests) would climb with every overestimate.
		own := max(m.ttft-p.rtt.v-math.Max(m.queueWait, m.prefillWait), 0)
		p.prefill.observeWeighted(float64(m.uncached), own, w)
		if m.outTokens > 1 {
			p.tpot.observeWeighted(m.loadAtStart+1, (m.e2e-m.ttft)/float64(m.outTokens-1), w)
		}
		p.learnedAt = now
	}
}
