package scaling

// MixClass is one class of a service's request mix: requests of about In prompt tokens and
// Out output tokens (the class's mean lengths), arriving at Rate requests a second. A
// service's mix is a few of these (control.Controller.Mix): the routers count requests by
// length class, and the control plane keeps a window of their counts.
type MixClass struct {
	In, Out int
	Rate    float64
}
