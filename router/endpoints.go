package router

import (
	"bytes"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
)

// The endpoints vLLM serves beside generation (vllm/entrypoints/openai/api_server.py,
// 0.11): rerank, score, pooling, classify, audio, tokenize. Each needs its model to serve a
// task (fleet.Serves): a replica's declared tasks say which, and a replica that declares
// none is tried and, on vLLM's refusal ("The model does not support … API", or the 404 of
// a vLLM that leaves the route out), taken off that API's candidates for its life, the
// request going on to another replica unseen by the client.

// routedPaths is what the router routes, for the answer to a path it does not.
const routedPaths = "POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/rerank (/rerank, /v2/rerank), /v1/score (/score), /pooling, /classify, /v1/audio/transcriptions, /v1/audio/translations, /tokenize, /detokenize; GET /v1/models, /v1/models/{model}, /v1/responses/{id}"

// kindFor maps a routed POST path to its request kind.
func kindFor(path string) (oai.Kind, bool) {
	switch path {
	case "/v1/chat/completions":
		return oai.Chat, true
	case "/v1/completions":
		return oai.Completion, true
	case "/v1/embeddings":
		return oai.Embedding, true
	case "/v1/responses":
		return oai.Responses, true
	case "/v1/rerank", "/rerank", "/v2/rerank":
		return oai.Rerank, true
	case "/v1/score", "/score":
		return oai.Score, true
	case "/pooling":
		return oai.Pooling, true
	case "/classify":
		return oai.Classify, true
	case "/tokenize", "/detokenize":
		return oai.Tokenize, true
	case "/v1/audio/transcriptions", "/v1/audio/translations":
		return oai.Transcription, true
	}
	return 0, false
}

// apiOf is the API a kind of request needs its replica's model to serve ("": any model).
func apiOf(k oai.Kind) string {
	switch k {
	case oai.Chat, oai.Completion, oai.Responses:
		return fleet.APIGenerate
	case oai.Embedding:
		return fleet.APIEmbeddings
	case oai.Rerank, oai.Score:
		return fleet.APIScore
	case oai.Pooling:
		return fleet.APIPooling
	case oai.Classify:
		return fleet.APIClassify
	case oai.Transcription:
		return fleet.APITranscription
	}
	return ""
}

// apiBit is an API's bit in a replica's refused set.
func apiBit(api string) uint32 {
	switch api {
	case fleet.APIGenerate:
		return 1
	case fleet.APIEmbeddings:
		return 2
	case fleet.APIScore:
		return 4
	case fleet.APIPooling:
		return 8
	case fleet.APIClassify:
		return 16
	case fleet.APITranscription:
		return 32
	}
	return 0
}

// apiName is the API as vLLM names it in its refusal.
func apiName(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "Chat Completions API"
	case "/v1/completions":
		return "Completions API"
	case "/v1/embeddings":
		return "Embeddings API"
	case "/v1/responses":
		return "Responses API"
	case "/v1/rerank", "/rerank", "/v2/rerank":
		return "Rerank (Score) API"
	case "/v1/score", "/score":
		return "Score API"
	case "/pooling":
		return "Pooling API"
	case "/classify":
		return "Classification API"
	case "/v1/audio/transcriptions":
		return "Transcriptions API"
	case "/v1/audio/translations":
		return "Translations API"
	}
	return path
}

// serves reports whether r may take a request for api: its declared tasks include it and it
// has not refused it.
func serves(r *Replica, api string) bool {
	if api == "" {
		return true
	}
	return fleet.Serves(r.Info().Tasks, api) && r.refused.Load()&apiBit(api) == 0
}

// servingCandidates is cands less the replicas that do not serve api: cands itself when
// all do (no copy on the common path), else a copy in buf.
func servingCandidates(cands []*Replica, api string, buf *[]*Replica) []*Replica {
	for i, r := range cands {
		if serves(r, api) {
			continue
		}
		out := append((*buf)[:0], cands[:i]...)
		for _, r := range cands[i+1:] {
			if serves(r, api) {
				out = append(out, r)
			}
		}
		*buf = out
		return out
	}
	return cands
}

var (
	doesNotSupport  = []byte("does not support")
	fastAPINotFound = []byte(`{"detail":"Not Found"}`)
)

// refusesAPI reports whether a replica's whole answer is vLLM's refusal of the request's
// API: 0.11's 400 "The model does not support … API", or the bare 404 of a vLLM that left
// the route out. It then takes the replica off that API's candidates.
func (px *Proxy) refusesAPI(c *call, r *Replica, status int, body []byte) bool {
	api := apiOf(c.kind)
	if api == "" || status != fasthttp.StatusBadRequest && status != fasthttp.StatusNotFound {
		return false
	}
	if !bytes.Contains(body, doesNotSupport) && !bytes.Equal(bytes.TrimSpace(body), fastAPINotFound) {
		return false
	}
	if r.refused.Or(apiBit(api))&apiBit(api) == 0 {
		px.met.fail("api_not_served", c.service)
		px.log.Warn("replica does not serve this API: no longer sent its requests", "replica", r.Info().ID, "model", c.model, "api", api)
	}
	return true
}

// notServed answers a request that no replica of its model serves: vLLM's own error shape
// (its ErrorResponse: message, type, param, code), 404.
func (px *Proxy) notServed(ctx *fasthttp.RequestCtx, c *call, n int) {
	px.refuse(ctx, notServedRefusal(c, n))
}

// notServedRefusal is the answer to a request for an API none of the n ready replicas of
// its model serves: vLLM's own 404, in its ErrorResponse shape.
func notServedRefusal(c *call, n int) *refusal {
	msg := fmt.Sprintf("The model `%s` does not support %s: none of its %d ready replicas serves it (their tasks, declared or shown by their answers, leave it out).", c.model, apiName(c.path), n)
	return &refusal{status: fasthttp.StatusNotFound, reason: "api_not_served", service: c.service, raw: vllmErrorBody(fasthttp.StatusNotFound, "NotFoundError", msg)}
}

// vllmErrorBody is an error in vLLM's ErrorResponse shape, whose code is the HTTP status.
func vllmErrorBody(status int, typ, msg string) []byte {
	b := oai.ErrorBody(typ, msg, "")
	b = append(b[:len(b)-len(`null}}`)], strconv.Itoa(status)...)
	return append(b, "}}"...)
}

// unknownPath answers a path the router does not route.
func (px *Proxy) unknownPath(ctx *fasthttp.RequestCtx, path string) {
	px.met.fail("unknown_path", "")
	oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, unknownPathMsg(string(ctx.Method()), path))
}

// unknownPathMsg is the 404's message for a path the router does not route, through the
// router or the picker.
func unknownPathMsg(method, path string) string {
	return fmt.Sprintf("Unknown path %s %s: Arbiter's router does not route it. It routes %s.", method, path, routedPaths)
}

// unknownModelMsg is the 404's message for a model no replica serves (OpenAI's
// model_not_found); where says where the name came from when not the body's "model".
func (px *Proxy) unknownModelMsg(name, where string) string {
	return fmt.Sprintf("The model `%s`%s does not exist. Served models: %v", name, where, px.servedModels())
}

// model answers GET /v1/models/{model} (OpenAI's retrieve model) from what the endpoint
// serves: the model object, or OpenAI's 404 model_not_found. vLLM serves no such path; the
// OpenAI SDKs' models.retrieve calls it, with a name's slashes escaped or not.
func (px *Proxy) model(ctx *fasthttp.RequestCtx, path string) {
	if !ctx.IsGet() {
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "use GET /v1/models/{model}")
		return
	}
	name := strings.TrimPrefix(path, "/v1/models/")
	if u, err := url.PathUnescape(name); err == nil {
		name = u
	}
	for _, m := range px.servedModels() {
		if m == name {
			b := []byte(`{"id":`)
			b = strconv.AppendQuote(b, m)
			b = append(b, `,"object":"model","created":0,"owned_by":"arbiter"}`...)
			ctx.SetContentType("application/json")
			ctx.SetBody(b)
			return
		}
	}
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	ctx.SetBody(oai.ErrorBody(oai.InvalidRequest, px.unknownModelMsg(name, ""), "model_not_found"))
}
