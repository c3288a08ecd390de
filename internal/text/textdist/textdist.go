// Package textdist measures how far apart two short names are, for "did you mean"
// suggestions in configuration and catalog errors.
package textdist

// Distance is the optimal-string-alignment distance between a and b: Levenshtein over
// runes, with a transposition of two neighbours counted as one edit (the typical typo).
func Distance(a, b string) int {
	s, t := []rune(a), []rune(b)
	// Three rolling rows: the transposition case looks two rows back.
	prev2 := make([]int, len(t)+1)
	prev := make([]int, len(t)+1)
	cur := make([]int, len(t)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(s); i++ {
		cur[0] = i
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(t)]
}
