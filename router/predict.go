package router

import "math"

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
