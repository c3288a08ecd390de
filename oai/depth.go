package oai

// MaxDepth bounds how deeply a request's JSON may nest. OpenAI requests nest a handful of
// levels (a tool's JSON-schema parameters a few more); a body nested thousands deep is an
// attack on the parser's stack and memory, refused before it is parsed.
const MaxDepth = 64

// MaxValues bounds a request's JSON values (a 128k-token prompt given as token ids is 128k
// of them; this allows four times that). Each costs a parser about 550 bytes, so a body of a
// few megabytes of "{}," would otherwise parse into gigabytes; at the bound a parse takes
// about 300 MiB.
const MaxValues = 1 << 19

// ParseCostPerValue is about what a parsed JSON value costs in memory, in bytes: fastjson's
// value, its parent's pointer to it, and the doubling growth of the parser's cache and
// arrays (measured with Go 1.26 and fastjson 1.6: 470–490 for numbers and strings, 520 for
// a prompt of token ids, 230 per Scan value for empty objects; TestParseCostCoversWhatAParseTakes).
const ParseCostPerValue = 550

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

// ParseCost is about what parsing a body of n bytes and values JSON values takes in
// memory: the parser's copy of the body, the strings taken out of it (a prompt's text),
// and the values (with a little to spare: an estimate short of the parse bounds nothing).
func ParseCost(n, values int) int64 {
	return 9*int64(n)/4 + int64(values)*ParseCostPerValue
}
