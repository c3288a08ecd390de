//go:build race

package engine

// raceEnabled: the test binary runs under the race detector, which makes the replays of
// published measurements (single-threaded engine steps, some millions of them) 15× slower
// and checks nothing they do; .ci/run runs them without it.
const raceEnabled = true
