package textdist

import "testing"

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"kitten", "sitting", 3},
		{"", "abc", 3},
		{"same", "same", 0},
		{"replica_polcy", "replica_policy", 1},
		{"ab", "ba", 1}, // a transposition is one edit
		{"A10O", "A100", 1},
		{"zoné", "zone", 1}, // runes, not bytes
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
