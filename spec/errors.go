package spec

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/internal/text/textdist"
)

// Error is one problem in a service.yaml, placed at the key or value it is about so that
// editors and terminals can jump there.
type Error struct {
	File   string
	Line   int // 1-based; 0 when the problem has no single place (the file is empty)
	Column int // 1-based; 0 when yaml.v3 reported only a line
	Msg    string
}

// Error formats as file:line:col: msg, leaving out the parts that are unknown, the way the
// Go toolchain prints positions.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 {
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteByte(':')
		if e.Column > 0 {
			b.WriteString(strconv.Itoa(e.Column))
			b.WriteByte(':')
		}
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in one file, in file order. Parse reports them all at once
// so that a user fixes a file in one round rather than one error per run.
type ErrorList []*Error

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap lets errors.As find an individual *Error.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// errorf records a problem at n (the whole file when n is nil).
func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	e := &Error{File: d.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

// result is the error Parse returns: nil, or the problems sorted into file order with
// duplicates removed (an any_of entry can meet the same base problem more than once).
func (d *decoder) result() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	d.errs = slices.CompactFunc(d.errs, func(a, b *Error) bool { return *a == *b })
	list := d.errs
	return &list
}

// describe says what a node holds, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch {
	case n == nil || isNull(n):
		return "nothing"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.AliasNode:
		return "an alias"
	case n.ShortTag() == "!!str":
		return quote(n.Value)
	default:
		return clip(n.Value)
	}
}

// quote quotes a user's text for a message, shortened so that a pasted script does not
// bury the message.
func quote(s string) string { return strconv.Quote(clip(s)) }

func clip(s string) string {
	const max = 40
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max]) + "…"
}

// suggest returns the word of allowed that w is most likely a typo of, or "" when none is
// close. Distances are counted case-insensitively with transpositions as one edit
// (optimal string alignment), since "replica_polcy" and "Service" are the typical slips.
func suggest(w string, allowed []string) string {
	const maxLen = 64 // longer input is not a typo of a key, and the cost is quadratic
	if w == "" || utf8.RuneCountInString(w) > maxLen {
		return ""
	}
	limit := 2
	if utf8.RuneCountInString(w) <= 3 {
		limit = 1
	}
	best, bestDist := "", limit+1
	for _, a := range allowed {
		dist := textdist.Distance(strings.ToLower(w), strings.ToLower(a))
		if dist < bestDist && dist < utf8.RuneCountInString(a) {
			best, bestDist = a, dist
		}
	}
	return best
}

// hint is the tail of an "unknown" message: the likely intended word, or the whole list.
func hint(w string, allowed []string) string {
	if s := suggest(w, allowed); s != "" {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return "allowed: " + strings.Join(allowed, ", ")
}
