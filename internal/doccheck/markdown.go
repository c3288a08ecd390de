package doccheck

import (
	"regexp"
	"strings"
	"unicode"
)

// Block is a fenced code block of a Markdown file.
type Block struct {
	Lang string // the info string's first word: "sh", "yaml", "" for none
	Line int    // 1-based line of the opening fence
	Text string
}

// Link is an inline link or image target outside code.
type Link struct {
	Target string
	Line   int
}

// Doc is what the checks need of one Markdown file.
type Doc struct {
	Blocks   []Block
	Links    []Link
	Headings []string // the text of each ATX heading, in order
}

var (
	fenceRE   = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^\\s`]*)")
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	// linkRE finds [text](target) and ![alt](target); the text may hold one level of
	// brackets or code (a link's text is often a path in backticks).
	linkRE = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
)

// Parse reads the blocks, links and headings of a Markdown text. It understands what this
// repository's files use (fenced blocks, inline links, ATX headings), not all of CommonMark.
func Parse(text string) Doc {
	var d Doc
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if m := fenceRE.FindStringSubmatch(lines[i]); m != nil {
			fence, start := m[1], i
			var body []string
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), fence); i++ {
				body = append(body, lines[i])
			}
			d.Blocks = append(d.Blocks, Block{Lang: m[2], Line: start + 1, Text: strings.Join(body, "\n")})
			continue
		}
		if m := headingRE.FindStringSubmatch(lines[i]); m != nil {
			d.Headings = append(d.Headings, m[1])
		}
		// Code spans hold example syntax, not links.
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(lines[i], ""), -1) {
			d.Links = append(d.Links, Link{Target: m[1], Line: i + 1})
		}
	}
	return d
}

// Anchors returns the fragment ids GitHub gives a file's headings: the heading's text
// without markup, lower-cased, with every character that is not a letter, digit, mark,
// '-', '_' or space dropped and spaces made '-'; a repeated id gets -1, -2...
func Anchors(headings []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headings {
		h = linkRE.ReplaceAllStringFunc(h, func(l string) string { // [text](url) → text
			return l[strings.IndexByte(l, '[')+1 : strings.LastIndex(l, "](")]
		})
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			seen[id]++
			id = id + "-" + itoa(n)
		} else {
			seen[id] = 1
		}
		out[id] = true
	}
	return out
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// Commands splits a shell block into simple commands, each a list of words: lines ending
// in '\' are joined, comments dropped, quotes removed from words, and `&&`, `||`, `|`, `;`
// and `&` end a command. Enough for the commands docs show, not a shell.
func Commands(block string) [][]string {
	block = strings.ReplaceAll(block, "\\\n", " ")
	var cmds [][]string
	for _, line := range strings.Split(block, "\n") {
		var words []string
		var w strings.Builder
		inWord := false
		var quote rune
		flush := func() {
			if inWord {
				words = append(words, w.String())
			}
			w.Reset()
			inWord = false
		}
		end := func() {
			flush()
			if len(words) > 0 {
				cmds = append(cmds, words)
			}
			words = nil
		}
	scan:
		for _, r := range line {
			switch {
			case quote != 0:
				if r == quote {
					quote = 0
				} else {
					w.WriteRune(r)
				}
			case r == '\'' || r == '"':
				quote, inWord = r, true
			case r == '#' && !inWord:
				break scan
			case r == ' ' || r == '\t':
				flush()
			case r == '|' || r == '&' || r == ';':
				end()
			default:
				w.WriteRune(r)
				inWord = true
			}
		}
		end()
	}
	return cmds
}
