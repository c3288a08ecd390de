package oai

import (
	"strings"

	"github.com/valyala/fastjson"
)

// The pooling, scoring and small endpoints vLLM serves beside generation
// (vllm/entrypoints/openai/api_server.py and protocol.py, 0.11): prompt-only requests, whose
// cost is their prefill and whose usage counts prompt tokens.
const (
	// Rerank is /rerank, /v1/rerank and /v2/rerank (Jina's and Cohere's shape, vLLM's
	// RerankRequest): a query and documents; each document is scored with the query, so the
	// query is prefilled once per document.
	Rerank Kind = iota + Responses + 1
	// Score is /score and /v1/score (ScoreRequest): text_1 and text_2, a string or a list
	// each; one text_1 is paired with every text_2, else they pair in order.
	Score
	// Pooling is /pooling (PoolingRequest): input as an embeddings request's, or messages.
	Pooling
	// Classify is /classify (ClassificationRequest): input, a string or a list.
	Classify
	// Tokenize is /tokenize and /detokenize: no inference; only the model is read.
	Tokenize
	// Transcription is /v1/audio/transcriptions and /v1/audio/translations: a
	// multipart/form-data body (MultipartFields reads it), not JSON.
	Transcription
)

// Generates reports whether the kind's requests generate tokens (so that their timing
// teaches the latency predictor about decoding); pooling, scoring, tokenizing and audio
// requests do not.
func (k Kind) Generates() bool { return k == Chat || k == Completion || k == Responses }

// poolingInput reads the prompt of a pooling-kind request into r.
func poolingInput(sb *strings.Builder, r *Request, v *fastjson.Value, kind Kind) error {
	switch kind {
	case Rerank:
		q := v.Get("query")
		if q == nil || q.Type() == fastjson.TypeNull {
			return bad("'query' is required")
		}
		if err := appendScoreText(sb, q, "query"); err != nil {
			return err
		}
		r.SharedText = sb.String()
		d := v.Get("documents")
		if d == nil || d.Type() == fastjson.TypeNull {
			return bad("'documents' is required: a list of strings")
		}
		n, err := appendScoreTexts(sb, d, "documents")
		if err != nil {
			return err
		}
		r.Pairs = n
	case Score:
		t1, t2 := v.Get("text_1"), v.Get("text_2")
		if t1 == nil || t2 == nil || t1.Type() == fastjson.TypeNull || t2.Type() == fastjson.TypeNull {
			return bad("'text_1' and 'text_2' are required: a string or a list of strings each")
		}
		n1, err := appendScoreTexts(sb, t1, "text_1")
		if err != nil {
			return err
		}
		if n1 == 1 {
			r.SharedText = sb.String() // one text_1 is scored against every text_2
		}
		n2, err := appendScoreTexts(sb, t2, "text_2")
		if err != nil {
			return err
		}
		r.Pairs = max(n1, n2)
	case Pooling:
		if msgs := v.Get("messages"); msgs != nil && msgs.Type() == fastjson.TypeArray {
			for i, m := range msgs.GetArray() {
				if m.Type() != fastjson.TypeObject {
					return bad("'messages[%d]' must be an object", i)
				}
				if err := appendContent(sb, m.Get("content"), i); err != nil {
					return err
				}
				r.Messages++
			}
			return nil
		}
		return appendPrompt(sb, &r.TokenIDs, v.Get("input"), "input")
	case Classify:
		return appendPrompt(sb, &r.TokenIDs, v.Get("input"), "input")
	}
	return nil
}

// appendScoreTexts reads a score or rerank text list: a string, a list of strings, or
// vLLM's multi-modal form ({"content": [parts]}), whose text parts count. It returns the
// number of texts.
func appendScoreTexts(sb *strings.Builder, v *fastjson.Value, field string) (int, error) {
	if v.Type() != fastjson.TypeArray {
		return 1, appendScoreText(sb, v, field)
	}
	items := v.GetArray()
	if len(items) == 0 {
		return 0, bad("'%s' must not be empty", field)
	}
	for i, it := range items {
		if it.Type() != fastjson.TypeString {
			return 0, bad("'%s[%d]' must be a string", field, i)
		}
		if sb.Len() > 0 {
			sb.WriteByte('\n')
		}
		sb.Write(it.GetStringBytes())
	}
	return len(items), nil
}

// appendScoreText reads one text: a string or {"content": [parts]}.
func appendScoreText(sb *strings.Builder, v *fastjson.Value, field string) error {
	switch v.Type() {
	case fastjson.TypeString:
		if sb.Len() > 0 {
			sb.WriteByte('\n')
		}
		sb.Write(v.GetStringBytes())
		return nil
	case fastjson.TypeObject:
		if c := v.Get("content"); c != nil && c.Type() == fastjson.TypeArray {
			return appendContent(sb, c, 0)
		}
	}
	return bad("'%s' must be a string, a list of strings or {\"content\": [parts]}", field)
}
