package replicasim

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/oai"
)

// The Responses API (POST /v1/responses), as vLLM 0.11 serves it for a plain (non-Harmony)
// model (vllm/entrypoints/openai/serving_responses.py; the event and object types are the
// openai package's, vllm/entrypoints/openai/protocol.py ResponsesResponse and ResponseUsage):
//
//   - a whole answer is a response object (object "response", id "resp_…", output: one
//     assistant message item with one output_text part, usage with input_tokens,
//     output_tokens and their details);
//   - a stream is typed SSE events, each "event: TYPE" then "data: {…}" with a sequence
//     number: response.created and response.in_progress at once, then per output item
//     response.output_item.added and response.content_part.added, a
//     response.output_text.delta per token, the .done events, and response.completed whose
//     response carries the usage. There is no [DONE].
//   - vLLM stores responses only when started with VLLM_ENABLE_RESPONSES_API_STORE=1 (and
//     the request's store, default true); then previous_response_id continues a stored one
//     and GET /v1/responses/{id} returns it, else both answer 404 "Response with id '…' not
//     found.". The simulator does the same (StoreResponses, or the same variable).

// maxStoredResponses bounds the simulator's store (vLLM's grows without bound: its own
// FIXME says so).
const maxStoredResponses = 10_000

// responsesRequest is what a Responses request adds to a generation.
type responsesRequest struct {
	// id and msgID are the response's and its message's ids: random, as vLLM's are
	// (resp_ and msg_ with random_uuid()), so no two replicas ever give the same one.
	id, msgID    string
	instructions *string
	previous     string
	store        bool
	prevTokens   int // the stored conversation's tokens, prefilled again
}

type storedResponse struct {
	body   []byte
	tokens int // input + output: what a continuation prefills again
}

// responseStore is the replica's stored responses, oldest dropped first past the bound.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string
}

func (rs *responseStore) get(id string) (storedResponse, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.byID[id]
	return r, ok
}

func (rs *responseStore) put(id string, r storedResponse) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byID == nil {
		rs.byID = map[string]storedResponse{}
	}
	if len(rs.order) >= maxStoredResponses {
		delete(rs.byID, rs.order[0])
		rs.order = rs.order[1:]
	}
	rs.byID[id] = r
	rs.order = append(rs.order, id)
}

// storesResponses reports whether this replica keeps responses, as vLLM does with
// VLLM_ENABLE_RESPONSES_API_STORE=1.
func (s *Server) storesResponses() bool {
	return s.cfg.StoreResponses || os.Getenv("VLLM_ENABLE_RESPONSES_API_STORE") == "1"
}

func notFoundResponse(ctx *fasthttp.RequestCtx, id string) {
	vllmError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", id))
}

// responsesFields reads what a Responses request adds (instructions, previous_response_id,
// store); on failure it has answered the client.
func (s *Server) responsesFields(ctx *fasthttp.RequestCtx, v *fastjson.Value, req *oai.Request) (*responsesRequest, bool) {
	rr := &responsesRequest{previous: req.PreviousResponseID, store: true, id: "resp_" + randomHex(), msgID: "msg_" + randomHex()}
	if iv := v.Get("instructions"); iv != nil && iv.Type() == fastjson.TypeString {
		t := string(iv.GetStringBytes())
		rr.instructions = &t
	}
	if sv := v.Get("store"); sv != nil && sv.Type() == fastjson.TypeFalse {
		rr.store = false
	}
	if !s.storesResponses() {
		rr.store = false // vLLM ignores store silently then (serving_responses.py)
	}
	if rr.previous != "" {
		prev, ok := s.responses.get(rr.previous)
		if !ok {
			notFoundResponse(ctx, rr.previous)
			return nil, false
		}
		rr.prevTokens = prev.tokens
	}
	return rr, true
}

// storedResponseGet answers GET /v1/responses/{id}.
func (s *Server) storedResponseGet(ctx *fasthttp.RequestCtx, path string) {
	id := strings.TrimPrefix(path, "/v1/responses/")
	if !ctx.IsGet() || strings.Contains(id, "/") {
		vllmError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	r, ok := s.responses.get(id)
	if !ok {
		notFoundResponse(ctx, id)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(r.body)
}

func (g *generation) responseID() string { return g.resp.id }
func (g *generation) messageID() string  { return g.resp.msgID }

// randomHex is 16 random bytes in hex, as Python's uuid4().hex.
func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// outputText is the whole answer's text.
func (g *generation) outputText(upTo int) string {
	var sb strings.Builder
	for i := range upTo {
		sb.WriteString(words[i%len(words)])
	}
	return sb.String()
}

// appendMessageItem appends the answer's message item, its text so far and its status.
func (g *generation) appendMessageItem(b []byte, text string, done bool) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, g.messageID()...)
	b = append(b, `","content":[`...)
	if done || text != "" {
		b = append(b, `{"annotations":[],"text":`...)
		b = strconv.AppendQuote(b, text)
		b = append(b, `,"type":"output_text","logprobs":null}`...)
	}
	b = append(b, `],"role":"assistant","status":"`...)
	if done {
		b = append(b, "completed"...)
	} else {
		b = append(b, "in_progress"...)
	}
	return append(b, `","type":"message"}`...)
}

// appendResponseObject appends the response object: in progress (no output, no usage) or
// completed (the message and the usage).
func (g *generation) appendResponseObject(b []byte, done bool) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, g.responseID()...)
	b = append(b, `","created_at":`...)
	b = strconv.AppendInt(b, g.created, 10)
	b = append(b, `,"incomplete_details":null,"instructions":`...)
	if g.resp.instructions != nil {
		b = strconv.AppendQuote(b, *g.resp.instructions)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"metadata":null,"model":`...)
	b = strconv.AppendQuote(b, g.model)
	b = append(b, `,"object":"response","output":[`...)
	if done {
		b = g.appendMessageItem(b, g.outputText(g.max), true)
	}
	b = append(b, `],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":`...)
	b = strconv.AppendInt(b, int64(g.max), 10)
	b = append(b, `,"max_tool_calls":null,"previous_response_id":`...)
	if g.resp.previous != "" {
		b = strconv.AppendQuote(b, g.resp.previous)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"prompt":null,"reasoning":null,"service_tier":"auto","status":"`...)
	if done {
		b = append(b, "completed"...)
	} else {
		b = append(b, "in_progress"...)
	}
	b = append(b, `","text":null,"top_logprobs":null,"truncation":"disabled","usage":`...)
	if done {
		b = append(b, `{"input_tokens":`...)
		b = strconv.AppendInt(b, int64(g.prompt), 10)
		b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
		cached := 0
		if len(g.seqs) > 0 {
			cached = g.srv.drv.cachedTokens(g.seqs[0].p)
		}
		b = strconv.AppendInt(b, int64(cached), 10)
		b = append(b, `},"output_tokens":`...)
		b = strconv.AppendInt(b, int64(g.completion()), 10)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = strconv.AppendInt(b, int64(g.prompt+g.completion()), 10)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	return append(b, `,"user":null}`...)
}

// finishResponse stores a finished answer when the replica keeps responses.
func (g *generation) finishResponse(body []byte) {
	if g.resp.store {
		g.srv.responses.put(g.responseID(), storedResponse{body: body, tokens: g.prompt + g.completion()})
	}
}

// responsesEvents writes a Responses stream's typed events.
type responsesEvents struct {
	g   *generation
	seq int
	buf []byte
}

// event appends one event: its fields (a JSON object's members, without braces), then the
// sequence number and type that every event carries.
func (e *responsesEvents) event(typ string, fields func([]byte) []byte) {
	e.buf = append(e.buf, "event: "...)
	e.buf = append(e.buf, typ...)
	e.buf = append(e.buf, "\ndata: {"...)
	e.buf = fields(e.buf)
	e.buf = append(e.buf, `,"sequence_number":`...)
	e.buf = strconv.AppendInt(e.buf, int64(e.seq), 10)
	e.buf = append(e.buf, `,"type":"`...)
	e.buf = append(e.buf, typ...)
	e.buf = append(e.buf, "\"}\n\n"...)
	e.seq++
}

func (e *responsesEvents) response(done bool) func([]byte) []byte {
	return func(b []byte) []byte { return e.g.appendResponseObject(append(b, `"response":`...), done) }
}

func (e *responsesEvents) item(done bool, text string) func([]byte) []byte {
	return func(b []byte) []byte {
		b = e.g.appendMessageItem(append(b, `"item":`...), text, done)
		return append(b, `,"output_index":0`...)
	}
}

func (e *responsesEvents) part(text string) func([]byte) []byte {
	return func(b []byte) []byte {
		b = append(b, `"content_index":0,"item_id":"`...)
		b = append(b, e.g.messageID()...)
		b = append(b, `","output_index":0,"part":{"annotations":[],"text":`...)
		b = strconv.AppendQuote(b, text)
		return append(b, `,"type":"output_text","logprobs":null}`...)
	}
}

func (e *responsesEvents) text(key, text string) func([]byte) []byte {
	return func(b []byte) []byte {
		b = append(b, `"content_index":0,"`...)
		b = append(b, key...)
		b = append(b, `":`...)
		b = strconv.AppendQuote(b, text)
		b = append(b, `,"item_id":"`...)
		b = append(b, e.g.messageID()...)
		return append(b, `","logprobs":[],"output_index":0`...)
	}
}

// flush writes what is buffered; false when the client is gone.
func (e *responsesEvents) flush(w *bufio.Writer) bool {
	_, err := w.Write(e.buf)
	e.buf = e.buf[:0]
	return err == nil && w.Flush() == nil
}

// streamResponses is stream's counterpart for the Responses API.
func (g *generation) streamResponses(w *bufio.Writer) {
	e := &responsesEvents{g: g, buf: make([]byte, 0, 1024)}
	e.event("response.created", e.response(false))
	e.event("response.in_progress", e.response(false))
	if !e.flush(w) {
		g.abandon()
		g.record("abort")
		return
	}
	sent := 0
	for sent < g.max {
		have, ok := g.waitFor(sent + 1)
		if !ok {
			return
		}
		if sent == 0 {
			e.event("response.output_item.added", e.item(false, ""))
			e.event("response.content_part.added", e.part(""))
		}
		for ; sent < have; sent++ {
			if (g.fault.Kind == FaultDieMidStream || g.fault.Kind == FaultCrash) && sent >= g.fault.AfterTokens {
				_ = e.flush(w)
				g.srv.die(g.conn, g.fault)
				g.abandon()
				return
			}
			e.event("response.output_text.delta", e.text("delta", words[sent%len(words)]))
		}
		if !e.flush(w) {
			g.abandon()
			g.record("abort")
			return
		}
	}
	text := g.outputText(g.max)
	e.event("response.output_text.done", e.text("text", text))
	e.event("response.content_part.done", e.part(text))
	e.event("response.output_item.done", e.item(true, text))
	e.event("response.completed", e.response(true))
	g.finishResponse(g.appendResponseObject(nil, true))
	_ = e.flush(w)
	g.account()
}
