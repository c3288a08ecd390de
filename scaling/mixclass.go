package scaling

// MixClass is one class of a service's request mix: requests of about In prompt tokens and
// Out output tokens arriving at Rate a second.
type MixClass struct {
	In, Out int
	Rate    float64
}
