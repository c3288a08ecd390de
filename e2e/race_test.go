//go:build race

package e2e

// raceEnabled builds the daemon with the race detector when the tests run under it, so
// the control plane's concurrency is checked in the end-to-end runs too.
const raceEnabled = true
