package scaling

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// The GPU mix: how many replicas of each GPU type serve a request mix at the least cost
// within the SLO. It is Mélange's integer program (Griggs et al., "Mélange: Cost Efficient
// Large Language Model Serving by Exploiting GPU Heterogeneity", arXiv:2404.14527, §5):
// each class of requests (by prompt and output length) has a rate, each GPU type a price
// and the rate one replica sustains within the SLO serving that class alone; each class's
// load is split over the types (fractions), each type's replicas must cover the share of
// load it is given (Σ_b λ_b·x_bg ÷ T_gb ≤ n_g), and the replica counts n_g are whole.
// The linear relaxation is gonum's simplex; the whole counts come by branch and bound.

// MixType is one GPU type a mix may use.
type MixType struct {
	// Name is what the type is called in reasons (its accelerator, e.g. "L4").
	Name string
	// PricePerHour is what one more replica of the type costs.
	PricePerHour float64
	// Rates[b] is the requests a second one replica sustains within the SLO serving
	// class b alone; 0 where it cannot serve b within the SLO at all.
	Rates []float64
	// Min and Max bound the type's replicas (Max 0: unbounded).
	Min, Max int
}

// MixSolution is a mix: replicas per type and how the classes' load is split over them.
type MixSolution struct {
	Counts []int
	// Cost is Σ price × count, $/hour.
	Cost float64
	// Share[b][g] is the fraction of class b's load type g serves.
	Share [][]float64
	// Unserved lists the classes with load that no type can serve within the SLO; they
	// are left out of the program (their requests still go to whichever replica is
	// least bad, and miss the SLO).
	Unserved []int
}

// ErrMixInfeasible: the bounds (Max, the total) leave too few replicas for the load.
var ErrMixInfeasible = errors.New("the load needs more replicas than the bounds allow")

// mixNodeLimit bounds branch and bound; past it the best whole mix found is returned
// (the root's rounding up is always one).
const mixNodeLimit = 4000

// SolveMix returns the cheapest whole mix of types serving the classes' load within the
// SLO, with at most maxTotal replicas in all (0: no bound).
func SolveMix(classes []MixClass, types []MixType, maxTotal int) (MixSolution, error) {
	if len(types) == 0 {
		return MixSolution{}, errors.New("no GPU type to choose from")
	}
	for i, t := range types {
		if len(t.Rates) != len(classes) {
			return MixSolution{}, fmt.Errorf("type %s: %d rates for %d classes", t.Name, len(t.Rates), len(classes))
		}
		if t.Min < 0 || t.Max < 0 || (t.Max > 0 && t.Min > t.Max) || !(t.PricePerHour >= 0) || math.IsInf(t.PricePerHour, 0) {
			return MixSolution{}, fmt.Errorf("type %d (%s): min %d, max %d, price %v: want 0 ≤ min ≤ max (0: no max), a finite price ≥ 0", i, t.Name, t.Min, t.Max, t.PricePerHour)
		}
	}
	p := mixProblem{types: types, maxTotal: maxTotal}
	for b, c := range classes {
		if !(c.Rate >= 0) || math.IsInf(c.Rate, 0) {
			return MixSolution{}, fmt.Errorf("class %d: rate %v: want a finite rate ≥ 0", b, c.Rate)
		}
		if c.Rate == 0 {
			continue
		}
		served := false
		for _, t := range types {
			if t.Rates[b] > 0 {
				served = true
			}
		}
		if !served {
			p.unserved = append(p.unserved, b)
			continue
		}
		p.classes = append(p.classes, b)
		p.rates = append(p.rates, c.Rate)
	}
	lo, hi := make([]int, len(types)), make([]int, len(types))
	for g, t := range types {
		lo[g], hi[g] = t.Min, t.Max
		if t.Max == 0 {
			hi[g] = -1 // unbounded
		}
	}
	root, err := p.relax(lo, hi)
	if err != nil {
		return MixSolution{}, err
	}
	// Rounding the relaxation up is whole and covers the load; it bounds the search,
	// unless it breaks a bound.
	best := p.whole(root, func(v float64) int { return int(math.Ceil(v - 1e-7)) })
	bestCost := math.Inf(1)
	if p.fits(best.Counts) {
		bestCost = best.Cost
	}
	nodes := 0
	var search func(lo, hi []int, r relaxed)
	search = func(lo, hi []int, r relaxed) {
		nodes++
		if r.cost >= bestCost-1e-9 || nodes > mixNodeLimit {
			return
		}
		// Branch on the count furthest from whole.
		g, dist := -1, 1.0
		for i, v := range r.n {
			if f := v - math.Floor(v); f > 1e-6 && f < 1-1e-6 && math.Abs(f-0.5) < dist {
				g, dist = i, math.Abs(f-0.5)
			}
		}
		if g < 0 {
			s := p.whole(r, func(v float64) int { return int(math.Round(v)) })
			if s.Cost < bestCost-1e-9 && p.fits(s.Counts) {
				best, bestCost = s, s.Cost
			}
			return
		}
		down, up := slices.Clone(hi), slices.Clone(lo)
		down[g] = int(math.Floor(r.n[g]))
		up[g] = int(math.Ceil(r.n[g]))
		if down[g] >= lo[g] {
			if rd, err := p.relax(lo, down); err == nil {
				search(lo, down, rd)
			}
		}
		if hi[g] < 0 || up[g] <= hi[g] {
			if ru, err := p.relax(up, hi); err == nil {
				search(up, hi, ru)
			}
		}
	}
	search(lo, hi, root)
	if math.IsInf(bestCost, 1) {
		return MixSolution{}, ErrMixInfeasible
	}
	best.Unserved = p.unserved
	best.Share = p.shares(best.Share, len(classes))
	return best, nil
}

// mixProblem is SolveMix's program: the classes with load that some type serves.
type mixProblem struct {
	types    []MixType
	classes  []int // indexes into the caller's classes
	rates    []float64
	unserved []int
	maxTotal int
}

// relaxed is a solution of the linear relaxation.
type relaxed struct {
	n    []float64   // replicas per type
	x    [][]float64 // x[k][g]: the share of the k-th served class on type g
	cost float64
}

// relax solves the linear relaxation with lo ≤ n ≤ hi (hi < 0: unbounded). Standard form
// for gonum's simplex (A·v = b, v ≥ 0): variables x_kg (where type g serves class k),
// n_g, a slack per capacity row and per bound row.
func (p *mixProblem) relax(lo, hi []int) (relaxed, error) {
	G := len(p.types)
	type col struct{ k, g int }
	var xs []col
	for k, b := range p.classes {
		for g, t := range p.types {
			if t.Rates[b] > 0 {
				xs = append(xs, col{k, g})
			}
		}
	}
	nx := len(xs)
	nIdx := func(g int) int { return nx + g }
	ncols := nx + G + G // x, n, capacity slacks
	rows := len(p.classes) + G
	type bound struct {
		g     int // -1: the total
		upper bool
		v     int
	}
	var bounds []bound
	for g := range G {
		if lo[g] > 0 {
			bounds = append(bounds, bound{g, false, lo[g]})
		}
		if hi[g] >= 0 {
			bounds = append(bounds, bound{g, true, hi[g]})
		}
	}
	if p.maxTotal > 0 {
		bounds = append(bounds, bound{-1, true, p.maxTotal})
	}
	rows += len(bounds)
	ncols += len(bounds)
	A := mat.NewDense(rows, ncols, nil)
	b := make([]float64, rows)
	c := make([]float64, ncols)
	for i, xc := range xs {
		A.Set(xc.k, i, 1)
		A.Set(len(p.classes)+xc.g, i, p.rates[xc.k]/p.types[xc.g].Rates[p.classes[xc.k]])
	}
	for k := range p.classes {
		b[k] = 1
	}
	for g, t := range p.types {
		r := len(p.classes) + g
		A.Set(r, nIdx(g), -1)
		A.Set(r, nx+G+g, 1)
		// A free replica still costs a little, so that no more are bought than needed.
		c[nIdx(g)] = t.PricePerHour + 1e-6
	}
	for j, bd := range bounds {
		r, s := len(p.classes)+G+j, nx+2*G+j
		if bd.g < 0 {
			for g := range G {
				A.Set(r, nIdx(g), 1)
			}
		} else {
			A.Set(r, nIdx(bd.g), 1)
		}
		if bd.upper {
			A.Set(r, s, 1)
		} else {
			A.Set(r, s, -1)
		}
		b[r] = float64(bd.v)
	}
	_, v, err := lp.Simplex(c, A, b, 1e-10, nil)
	if err != nil {
		if errors.Is(err, lp.ErrInfeasible) {
			return relaxed{}, ErrMixInfeasible
		}
		return relaxed{}, fmt.Errorf("mix program: %w", err)
	}
	r := relaxed{n: make([]float64, G), x: make([][]float64, len(p.classes))}
	for k := range r.x {
		r.x[k] = make([]float64, G)
	}
	for i, xc := range xs {
		r.x[xc.k][xc.g] = max(v[i], 0)
	}
	for g, t := range p.types {
		r.n[g] = max(v[nIdx(g)], 0)
		r.cost += t.PricePerHour * r.n[g]
	}
	return r, nil
}

// whole turns a relaxed solution into counts with round, keeping its split.
func (p *mixProblem) whole(r relaxed, round func(float64) int) MixSolution {
	s := MixSolution{Counts: make([]int, len(p.types)), Share: r.x}
	for g, t := range p.types {
		s.Counts[g] = max(round(r.n[g]), t.Min)
		s.Cost += t.PricePerHour * float64(s.Counts[g])
	}
	return s
}

// fits reports whether counts keep every bound.
func (p *mixProblem) fits(counts []int) bool {
	total := 0
	for g, n := range counts {
		if t := p.types[g]; n < t.Min || (t.Max > 0 && n > t.Max) {
			return false
		}
		total += n
	}
	return p.maxTotal == 0 || total <= p.maxTotal
}

// shares maps the served classes' split back onto the caller's class indexes.
func (p *mixProblem) shares(x [][]float64, classes int) [][]float64 {
	out := make([][]float64, classes)
	for k, b := range p.classes {
		if k < len(x) {
			out[b] = x[k]
		}
	}
	return out
}

// Covers reports whether counts serve the classes' load within the SLO: some split of each
// class's load over the types present keeps every type within its replicas. A class that
// no type at all serves is left out; one that only absent types serve is not covered.
func Covers(classes []MixClass, types []MixType, counts []int) bool {
	p := mixProblem{types: make([]MixType, len(types))}
	zero := make([]float64, len(classes))
	for g, t := range types {
		p.types[g] = MixType{Name: t.Name, PricePerHour: t.PricePerHour, Rates: t.Rates}
		if counts[g] == 0 {
			p.types[g].Rates = zero
		}
	}
	for b, c := range classes {
		if c.Rate <= 0 {
			continue
		}
		offered, present := false, false
		for g, t := range types {
			if t.Rates[b] > 0 {
				offered = true
				present = present || counts[g] > 0
			}
		}
		if !offered {
			continue
		}
		if !present {
			return false
		}
		p.classes = append(p.classes, b)
		p.rates = append(p.rates, c.Rate)
	}
	if len(p.classes) == 0 {
		return true
	}
	_, err := p.relax(counts, counts)
	return err == nil
}

// DescribeMix says a mix in a few words: "2 × L4 + 1 × H100 ($3.21/h)".
func DescribeMix(types []MixType, counts []int) string {
	var parts []string
	cost := 0.0
	for g, n := range counts {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d × %s", n, types[g].Name))
			cost += float64(n) * types[g].PricePerHour
		}
	}
	if len(parts) == 0 {
		return "no replicas"
	}
	return fmt.Sprintf("%s ($%.2f/h)", strings.Join(parts, " + "), cost)
}
