package router

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/oai"
)

// The Responses API keeps state on the replica that answered: vLLM stores a response
// (with store, and VLLM_ENABLE_RESPONSES_API_STORE on the server) so that a later request
// may continue it (previous_response_id) or fetch it (GET /v1/responses/{id}), and only that
// replica has it (vllm/entrypoints/openai/serving_responses.py keeps response_store in the
// server's memory). The router remembers which replica produced each response id it saw
// and sends those requests there; a request naming a response whose replica has left gets
// a clear 404 rather than another replica's "not found".

// maxResponseOwners bounds the response ids remembered (about 100 bytes each).
const maxResponseOwners = 200_000

// responseOwners maps a response id to the replica that produced it.
type responseOwners struct {
	c *lru.Cache[string, string]
}

func newResponseOwners() responseOwners {
	c, _ := lru.New[string, string](maxResponseOwners) // the size is positive: no error
	return responseOwners{c: c}
}

func (o responseOwners) remember(id, replica string) {
	if id != "" && len(id) <= 256 {
		o.c.Add(id, replica)
	}
}

func (o responseOwners) owner(id string) (string, bool) { return o.c.Get(id) }

// responseID reads the id of a whole Responses answer (its top-level "id").
func responseID(p *fastjson.Parser, body []byte) string {
	v, err := p.ParseBytes(body)
	if err != nil {
		return ""
	}
	return string(v.GetStringBytes("id"))
}

// eventResponseID reads the response id a Responses stream's response.created event
// carries (response.id).
func eventResponseID(p *fastjson.Parser, data []byte) string {
	v, err := p.ParseBytes(data)
	if err != nil {
		return ""
	}
	return string(v.GetStringBytes("response", "id"))
}

// responsesEvent classifies a Responses stream event by its type (the SSE event: field, or
// the data's "type" where a server sends no event: line).
type responsesEvent int

const (
	responsesOther responsesEvent = iota
	responsesCreated
	responsesDelta // a token of output: the first one is the time to first token
	responsesEnd   // response.completed, .incomplete or .failed: the stream's last event
)

var (
	evCreated    = []byte("response.created")
	evCompleted  = []byte("response.completed")
	evIncomplete = []byte("response.incomplete")
	evFailed     = []byte("response.failed")
	evDelta      = []byte(".delta")
)

func classifyResponsesEvent(ev, data []byte) responsesEvent {
	t := oai.EventType(ev)
	if t == nil {
		// No event: line: the type is the data's "type" field.
		if i := bytes.Index(data, []byte(`"type":"response.`)); i >= 0 {
			rest := data[i+len(`"type":"`):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				t = rest[:j]
			}
		}
	}
	switch {
	case bytes.Equal(t, evCreated):
		return responsesCreated
	case bytes.Equal(t, evCompleted), bytes.Equal(t, evIncomplete), bytes.Equal(t, evFailed):
		return responsesEnd
	case bytes.HasSuffix(t, evDelta):
		return responsesDelta
	}
	return responsesOther
}

// pin sends a request that continues a stored response to the replica that produced it.
// It returns false when it has answered the client: the replica that holds the response
// left, so no replica can continue it.
func (px *Proxy) pin(ctx *fasthttp.RequestCtx, c *call, prev string) bool {
	if f := px.pinFor(c, prev); f != nil {
		px.refuse(ctx, f)
		return false
	}
	return true
}

// pinFor sets c.pinned to the replica that stored prev, if this router knows it, or returns
// why the request cannot continue it.
func (px *Proxy) pinFor(c *call, prev string) *refusal {
	owner, ok := px.responses.owner(prev)
	if !ok {
		// Not seen by this router (another router's, or from before a restart): any
		// replica may hold it, and the one picked answers vLLM's own 404 if it does not.
		return nil
	}
	if r := px.pool.Get(owner); r != nil && r.Available(px.Now()) {
		c.pinned = r
		return nil
	}
	return &refusal{status: fasthttp.StatusNotFound, errType: oai.InvalidRequest, code: "previous_response_not_found", reason: "previous_response_gone", service: c.service,
		msg: fmt.Sprintf("Response with id '%s' was stored by replica %s, which no longer serves: what it stored left with it. Start the conversation again without previous_response_id.", prev, owner)}
}

// storedResponse forwards GET /v1/responses/{id} (and POST /v1/responses/{id}/cancel) to the
// replica that produced the response. Nothing is accounted: no tokens are generated.
func (px *Proxy) storedResponse(ctx *fasthttp.RequestCtx, path string) {
	rest := strings.TrimPrefix(path, "/v1/responses/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case id == "" || action != "" && action != "cancel":
		oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, fmt.Sprintf("Unknown path %s", path))
		return
	case action == "" && !ctx.IsGet() || action == "cancel" && !ctx.IsPost():
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "use GET /v1/responses/{id} or POST /v1/responses/{id}/cancel")
		return
	case ctx.QueryArgs().GetBool("stream"):
		// vLLM resumes a stored stream from an event (starting_after); the router does not
		// pass that stream through yet.
		oai.WriteError(ctx, fasthttp.StatusNotImplemented, oai.InvalidRequest, "GET /v1/responses/{id}?stream=true is not supported through Arbiter's router yet: fetch the stored response without stream")
		return
	}
	owner, ok := px.responses.owner(id)
	r := px.pool.Get(owner)
	if !ok || r == nil || !r.Available(px.Now()) {
		msg := fmt.Sprintf("Response with id '%s' not found: this router did not route it", id)
		if ok {
			msg = fmt.Sprintf("Response with id '%s' was stored by replica %s, which no longer serves", id, owner)
		}
		px.met.fail("previous_response_gone", "")
		ctx.Response.Reset()
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBody(oai.ErrorBody(oai.InvalidRequest, msg, "response_not_found"))
		return
	}
	now := px.Now()
	c := &call{kind: oai.Responses, model: r.Info().Model, start: now, deadline: now.Add(px.cfg.RequestTimeout)}
	c.route.Now = now
	c.firstByte = px.cfg.FirstByteTimeoutMin
	uc, _, err := px.send(ctx, c, r)
	if err != nil {
		px.upstreamFailed(r, "send", err)
		oai.WriteError(ctx, fasthttp.StatusBadGateway, oai.ServerError, fmt.Sprintf("replica %s did not answer: %v", r.Info().ID, err))
		return
	}
	hdr := &ctx.Response.Header
	upstreamClose := hdr.ConnectionClose()
	hdr.ResetConnectionClose() // the client's connection is ours to manage, not the replica's
	px.scrubUpstreamHeader(r, hdr)
	if err := ctx.Response.ReadBody(uc.br, px.cfg.MaxResponseBodyBytes); err != nil {
		_ = uc.Close()
		ctx.Response.Reset()
		oai.WriteError(ctx, fasthttp.StatusBadGateway, oai.ServerError, fmt.Sprintf("replica %s's answer could not be read: %v", r.Info().ID, err))
		return
	}
	if upstreamClose {
		_ = uc.Close()
	} else {
		r.conns.put(uc, time.Now())
	}
}
