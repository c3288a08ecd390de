package oai

// MaxDepth bounds how deeply a request's JSON may nest. OpenAI requests nest a handful of
// levels (a tool's JSON-schema parameters a few more); a body nested thousands deep is an
// attack on the parser's stack and memory, refused before it is parsed.
const MaxDepth = 64

// CheckDepth scans body once, without parsing it, and refuses nesting deeper than max.
// Brackets inside strings do not count.
func CheckDepth(body []byte, max int) error {
	depth, inString, escaped := 0, false, false
	for _, c := range body {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			if depth > max {
				return bad("body nests deeper than %d levels", max)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}
