// Package oai parses and answers the parts of the OpenAI HTTP API that the router and the
// replica simulator both need: the request fields that drive routing and accounting, the
// error shape, and SSE event framing.
package oai

import (
	"errors"
	"fmt"
	"strings"

	"github.com/valyala/fastjson"
)

// Kind is the endpoint a request is for.
type Kind int

const (
	Chat Kind = iota
	Completion
	Embedding
	// Responses is OpenAI's Responses API (POST /v1/responses), as vLLM serves it
	// (vllm/entrypoints/openai/serving_responses.py): the prompt from instructions and
	// input, the output bound from max_output_tokens; a stream of typed events that ends
	// with response.completed (no [DONE]), whose response.usage counts input_tokens and
	// output_tokens.
	Responses
)

// Request holds what routing and accounting need from a request body. Prompt is the text
// the model will read (message contents joined by newlines), for token counting and
// prefix hashing; it is a copy that outlives the body.
type Request struct {
	Kind   Kind
	Model  string
	Stream bool
	// IncludeUsage is stream_options.include_usage as the client sent it.
	IncludeUsage bool
	// HasStreamOptions is true when the body has a stream_options object.
	HasStreamOptions bool
	// MaxTokens is max_completion_tokens or max_tokens; 0 when absent (MaxTokensSet false).
	MaxTokens    int
	MaxTokensSet bool
	Prompt       string
	// TokenIDs is the prompt when a client sent token ids instead of text (completions and
	// embeddings accept both, never mixed in one array); the arrays of a batch are
	// concatenated in order. Prompt is then empty.
	TokenIDs []int
	// Messages is the number of chat messages (chat templates add tokens per message).
	Messages int
	// PreviousResponseID is a Responses request's previous_response_id: the response whose
	// conversation it continues, which only the replica that produced it holds.
	PreviousResponseID string
	// Pairs is the number of (query, document) or (text_1, text_2) pairs a rerank or score
	// request prefills; SharedText, when not empty, is the text prefilled with each of them
	// (a rerank's query, a score's one text_1), which Prompt holds once.
	Pairs      int
	SharedText string
	// CacheSalt is vLLM's cache_salt: a non-empty string that enters the hash of the
	// prompt's first KV block (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys),
	// so requests share cached prefixes only with requests of the same salt.
	CacheSalt string
}

// ErrBadRequest wraps every parse failure; its message names the field.
var ErrBadRequest = errors.New("bad request")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// Parse reads an OpenAI request body for the given endpoint kind. p is reused across calls
// by the caller (fastjson parsers are not safe for concurrent use).
func Parse(p *fastjson.Parser, body []byte, kind Kind) (Request, error) {
	v, err := ParseJSON(p, body)
	if err != nil {
		return Request{Kind: kind}, err
	}
	return FromValue(v, kind)
}

// ParseJSON parses a body into a JSON object, for callers that read more fields than
// Request holds (FromValue then reads Request's from the same value). v lives until p's
// next parse.
func ParseJSON(p *fastjson.Parser, body []byte) (*fastjson.Value, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, bad("body is not valid JSON: %v", err)
	}
	if v.Type() != fastjson.TypeObject {
		return nil, bad("body must be a JSON object")
	}
	return v, nil
}

// FromValue reads a request for the given endpoint kind from a parsed JSON object.
func FromValue(v *fastjson.Value, kind Kind) (Request, error) {
	r := Request{Kind: kind}
	// A missing model is left empty: vLLM serves its only model then, and the router does
	// the same when it serves one model.
	if mv := v.Get("model"); mv != nil && mv.Type() != fastjson.TypeNull {
		if mv.Type() != fastjson.TypeString {
			return r, bad("'model' must be a string")
		}
		r.Model = string(mv.GetStringBytes())
	}
	if sv := v.Get("stream"); sv != nil && sv.Type() != fastjson.TypeNull {
		b, err := sv.Bool()
		if err != nil {
			return r, bad("'stream' must be a boolean")
		}
		r.Stream = b
	}
	if so := v.Get("stream_options"); so != nil && so.Type() != fastjson.TypeNull {
		if so.Type() != fastjson.TypeObject {
			return r, bad("'stream_options' must be an object")
		}
		r.HasStreamOptions = true
		if iu := so.Get("include_usage"); iu != nil && iu.Type() != fastjson.TypeNull {
			b, err := iu.Bool()
			if err != nil {
				return r, bad("'stream_options.include_usage' must be a boolean")
			}
			r.IncludeUsage = b
		}
	}
	if cs := v.Get("cache_salt"); cs != nil && cs.Type() != fastjson.TypeNull {
		// vLLM's own check (protocol.py check_cache_salt_support).
		if cs.Type() != fastjson.TypeString || len(cs.GetStringBytes()) == 0 {
			return r, bad("Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		r.CacheSalt = string(cs.GetStringBytes())
	}
	maxKeys := []string{"max_completion_tokens", "max_tokens"}
	if kind == Responses {
		maxKeys = []string{"max_output_tokens"}
	}
	for _, key := range maxKeys {
		if mt := v.Get(key); mt != nil && mt.Type() != fastjson.TypeNull {
			n, err := mt.Int()
			if err != nil || n < 0 {
				return r, bad("'%s' must be a non-negative integer", key)
			}
			r.MaxTokens, r.MaxTokensSet = n, true
			break
		}
	}
	var sb strings.Builder
	switch kind {
	case Chat:
		msgs := v.Get("messages")
		if msgs == nil || msgs.Type() != fastjson.TypeArray {
			return r, bad("'messages' is required and must be an array")
		}
		arr, _ := msgs.Array()
		if len(arr) == 0 {
			return r, bad("'messages' must not be empty")
		}
		r.Messages = len(arr)
		for i, m := range arr {
			if m.Type() != fastjson.TypeObject {
				return r, bad("'messages[%d]' must be an object", i)
			}
			if role := m.Get("role"); role == nil || role.Type() != fastjson.TypeString {
				return r, bad("'messages[%d].role' is required and must be a string", i)
			}
			if err := appendContent(&sb, m.Get("content"), i); err != nil {
				return r, err
			}
		}
	case Completion:
		if err := appendPrompt(&sb, &r.TokenIDs, v.Get("prompt"), "prompt"); err != nil {
			return r, err
		}
	case Embedding:
		if err := appendPrompt(&sb, &r.TokenIDs, v.Get("input"), "input"); err != nil {
			return r, err
		}
	case Responses:
		if err := appendResponsesInput(&sb, &r, v); err != nil {
			return r, err
		}
	case Rerank, Score, Pooling, Classify:
		if err := poolingInput(&sb, &r, v, kind); err != nil {
			return r, err
		}
	}
	r.Prompt = sb.String()
	return r, nil
}

// appendContent adds a message's text: a string, or an array of parts whose text parts count.
func appendContent(sb *strings.Builder, c *fastjson.Value, i int) error {
	if c == nil || c.Type() == fastjson.TypeNull {
		return nil // assistant messages with tool calls may have no content
	}
	if sb.Len() > 0 {
		sb.WriteByte('\n')
	}
	switch c.Type() {
	case fastjson.TypeString:
		sb.Write(c.GetStringBytes())
		return nil
	case fastjson.TypeArray:
		parts, _ := c.Array()
		for j, p := range parts {
			if p.Type() != fastjson.TypeObject {
				return bad("'messages[%d].content[%d]' must be an object", i, j)
			}
			if t := p.GetStringBytes("text"); t != nil {
				sb.Write(t)
			}
		}
		return nil
	}
	return bad("'messages[%d].content' must be a string or an array of parts", i)
}

// appendPrompt accepts what OpenAI's prompt and input accept: a string, an array of strings,
// an array of token ids, or an array of such arrays. Text goes to sb, ids to ids.
func appendPrompt(sb *strings.Builder, ids *[]int, p *fastjson.Value, field string) error {
	if p == nil || p.Type() == fastjson.TypeNull {
		return bad("'%s' is required", field)
	}
	switch p.Type() {
	case fastjson.TypeString:
		sb.Write(p.GetStringBytes())
		return nil
	case fastjson.TypeArray:
		items, _ := p.Array()
		if len(items) == 0 {
			return bad("'%s' must not be empty", field)
		}
		switch items[0].Type() {
		case fastjson.TypeString:
			for i, it := range items {
				if it.Type() != fastjson.TypeString {
					return bad("'%s[%d]' must be a string like the items before it", field, i)
				}
				if i > 0 {
					sb.WriteByte('\n')
				}
				sb.Write(it.GetStringBytes())
			}
			return nil
		case fastjson.TypeNumber:
			return appendIDs(ids, items, field)
		case fastjson.TypeArray:
			for i, it := range items {
				inner, err := it.Array()
				if err != nil {
					return bad("'%s[%d]' must be an array of token ids like the items before it", field, i)
				}
				if len(inner) == 0 {
					return bad("'%s[%d]' must not be empty", field, i)
				}
				if err := appendIDs(ids, inner, fmt.Sprintf("%s[%d]", field, i)); err != nil {
					return err
				}
			}
			return nil
		}
		return bad("'%s[0]' must be a string or token ids", field)
	}
	return bad("'%s' must be a string or an array", field)
}

// maxTokenID bounds token ids to what a 32-bit vocabulary index can hold.
const maxTokenID = 1<<31 - 1

func appendIDs(ids *[]int, items []*fastjson.Value, field string) error {
	for i, it := range items {
		n, err := it.Int64()
		if err != nil || n < 0 || n > maxTokenID {
			return bad("'%s[%d]' must be a token id (an integer from 0 to %d)", field, i, maxTokenID)
		}
		*ids = append(*ids, int(n))
	}
	return nil
}

// appendResponsesInput reads a Responses request's prompt: instructions (a system message
// ahead of the input), then input, a string or a list of items. A message item (with or
// without "type":"message") has a role and content, a string or a list of parts whose
// text counts (input_text, output_text); other items (function_call_output, reasoning…)
// count their output or text where they have one. Each item counts as a message for the
// chat template's tokens.
func appendResponsesInput(sb *strings.Builder, r *Request, v *fastjson.Value) error {
	if iv := v.Get("instructions"); iv != nil && iv.Type() != fastjson.TypeNull {
		if iv.Type() != fastjson.TypeString {
			return bad("'instructions' must be a string")
		}
		sb.Write(iv.GetStringBytes())
		r.Messages++
	}
	if pv := v.Get("previous_response_id"); pv != nil && pv.Type() != fastjson.TypeNull {
		if pv.Type() != fastjson.TypeString || len(pv.GetStringBytes()) == 0 {
			return bad("'previous_response_id' must be a non-empty string")
		}
		r.PreviousResponseID = string(pv.GetStringBytes())
	}
	in := v.Get("input")
	if in == nil || in.Type() == fastjson.TypeNull {
		return bad("'input' is required: a string or a list of input items")
	}
	switch in.Type() {
	case fastjson.TypeString:
		if sb.Len() > 0 {
			sb.WriteByte('\n')
		}
		sb.Write(in.GetStringBytes())
		r.Messages++
		return nil
	case fastjson.TypeArray:
	default:
		return bad("'input' must be a string or a list of input items")
	}
	items, _ := in.Array()
	for i, it := range items {
		if it.Type() != fastjson.TypeObject {
			return bad("'input[%d]' must be an object", i)
		}
		r.Messages++
		if c := it.Get("content"); c != nil {
			if err := appendContent(sb, c, i); err != nil {
				return bad("'input[%d].content' must be a string or a list of parts", i)
			}
			continue
		}
		for _, key := range []string{"output", "text", "arguments"} {
			if t := it.Get(key); t != nil && t.Type() == fastjson.TypeString {
				if sb.Len() > 0 {
					sb.WriteByte('\n')
				}
				sb.Write(t.GetStringBytes())
				break
			}
		}
	}
	return nil
}
