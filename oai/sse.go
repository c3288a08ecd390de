package oai

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// NextEvent splits the first complete SSE event (terminated by a blank line, LF or CRLF)
// off buf. It returns the event including its terminator, and ok=false when buf holds no
// complete event yet.
func NextEvent(buf []byte) (event, rest []byte, ok bool) {
	return NextEventFrom(buf, 0)
}

// NextEventFrom is NextEvent for a buf whose first from bytes are known to hold no event
// terminator: a caller appending to a partial event scans only what is new (a terminator
// is at most 3 bytes, so it steps back 2), not the whole event again on every read.
func NextEventFrom(buf []byte, from int) (event, rest []byte, ok bool) {
	for i := max(from, 0); i < len(buf); i++ {
		if buf[i] != '\n' {
			continue
		}
		j := i + 1
		if j < len(buf) && buf[j] == '\r' {
			j++
		}
		if j < len(buf) && buf[j] == '\n' {
			return buf[:j+1], buf[j+1:], true
		}
	}
	return nil, buf, false
}

// EventType returns an event's event: field (the Responses API's typed events name
// themselves there: response.created, response.output_text.delta, response.completed…), or
// nil when it has none.
func EventType(event []byte) []byte {
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		if t, found := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\r")), []byte("event:")); found {
			return bytes.TrimSpace(t)
		}
	}
	return nil
}

// EventData returns the payload of an event's data lines (joined by newlines, as the SSE
// spec says), or nil when it has none.
func EventData(event []byte) []byte {
	var out []byte
	n := 0
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		d, found := bytes.CutPrefix(line, []byte("data:"))
		if !found {
			continue
		}
		d = bytes.TrimPrefix(d, []byte(" "))
		if n == 0 {
			out = d
		} else {
			out = append(append(append([]byte(nil), out...), '\n'), d...)
		}
		n++
	}
	return out
}

// ChunkUsage reads the usage object of a stream chunk or a whole response. isUsageOnly
// is true for the final usage chunk of a stream (no choices), which the router strips when
// the client did not ask for it. ok is false when data has no non-null usage; a usage whose
// numbers cannot be trusted is ok with u.Invalid set (see ReadUsage).
func ChunkUsage(p *fastjson.Parser, data []byte) (u Usage, isUsageOnly, ok bool) {
	if !bytes.Contains(data, usageKey) {
		return u, false, false // cheap check: most chunks carry no usage
	}
	v, err := p.ParseBytes(data)
	if err != nil {
		return u, false, false
	}
	uv := v.Get("usage")
	if uv == nil {
		// A Responses stream's usage is in its response.completed event's response.
		if rv := v.Get("response"); rv != nil && rv.Type() == fastjson.TypeObject {
			if uv = rv.Get("usage"); uv != nil && uv.Type() != fastjson.TypeNull {
				return ReadUsage(uv), false, true
			}
		}
		return u, false, false
	}
	if uv.Type() == fastjson.TypeNull {
		return u, false, false
	}
	u = ReadUsage(uv)
	ch := v.Get("choices")
	isUsageOnly = ch == nil || (ch.Type() == fastjson.TypeArray && len(ch.GetArray()) == 0)
	return u, isUsageOnly, true
}

// ResponseUsage reads the usage of a whole (non-streamed) response. OpenAI-style servers
// put usage last, so it parses only that object rather than the whole body, which may hold
// thousands of generated tokens; it falls back to a full parse when the shortcut fails.
func ResponseUsage(p *fastjson.Parser, body []byte) (Usage, bool) {
	if obj := lastObjectAfter(body, usageKey); obj != nil {
		if v, err := p.ParseBytes(obj); err == nil && v.Type() == fastjson.TypeObject {
			return ReadUsage(v), true
		}
	}
	u, _, ok := ChunkUsage(p, body)
	return u, ok
}

// lastObjectAfter returns the JSON object that follows the last occurrence of key and a
// colon, or nil when it cannot be delimited.
func lastObjectAfter(body, key []byte) []byte {
	i := bytes.LastIndex(body, key)
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return nil
	}
	depth, inString, escaped := 0, false, false
	for j, c := range rest {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return rest[:j+1]
			}
		}
	}
	return nil
}
