package oai

// MaxDepth bounds how deeply a request's JSON may nest. OpenAI requests nest a handful of
// levels (a tool's JSON-schema parameters a few more); a body nested thousands deep is an
// attack on the parser's stack and memory, refused before it is parsed.
const MaxDepth = 64

// MaxValues bounds a request's JSON values (a 128k-token prompt given as token ids is 128k
// of them). Each costs a parser about two hundred bytes, so a body of a few megabytes of "{},"
// would otherwise parse into gigabytes.
const MaxValues = 1 << 20

// ParseCostPerValue is about what a parsed JSON value costs in memory, in bytes (fastjson's
// value, its parent's pointer to it, and the growth of the parser's cache).
const ParseCostPerValue = 200

// Scan reads body once, without parsing it: it refuses nesting deeper than maxDepth or more
// than maxValues values, and returns how many values there are (roughly: containers and
// the separators between elements, so what a parse would allocate). Brackets and commas
// inside strings do not count.
func Scan(body []byte, maxDepth, maxValues int) (values int, err error) {
	depth, inString, escaped := 0, false, false
	values = 1
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
			values++
			if depth > maxDepth {
				return values, bad("body nests deeper than %d levels", maxDepth)
			}
		case c == '}' || c == ']':
			depth--
		case c == ',':
			values++
			if values > maxValues {
				return values, bad("body holds more than %d JSON values", maxValues)
			}
		}
	}
	return values, nil
}
