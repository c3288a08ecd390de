package engine

import "testing"

// PubTput is one GPU's throughput in a set of GPUs the public data measured alike: the
// published figure and the model's (pubTput, for tests outside the package).
type PubTput struct {
	Set, GPU         string
	Model, Published float64
}

// PublicThroughputs is every such figure the public checks replay.
func PublicThroughputs(t testing.TB) []PubTput {
	_, tputs := publicAtFit(t)
	out := make([]PubTput, len(tputs))
	for i, p := range tputs {
		out[i] = PubTput{p.set, p.gpu, p.model, p.published}
	}
	return out
}

// SkipUnderRace skips a test that replays published measurements under the race detector
// (raceEnabled).
func SkipUnderRace(t *testing.T) { skipUnderRace(t) }

func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("replays published measurements on single-threaded engines: the race detector checks nothing there and takes 15× as long; .ci/run runs it without")
	}
}
