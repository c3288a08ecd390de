package router

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// refusal is an answer a front door gives a request itself, before any replica has it, in
// OpenAI's error shape: the router writes it to its client, the endpoint picker returns it
// to the gateway as an immediate response. Either way the same check makes the same answer.
type refusal struct {
	status  int
	errType string
	msg     string
	code    string // OpenAI's error code ("": null)
	reason  string // the errors metric's label
	// service is the service of the request's model, for the errors metric ("": not known
	// when the request was refused).
	service string
	// retryAfter is the Retry-After header in seconds (0: none).
	retryAfter int
	// wwwAuthenticate is the WWW-Authenticate header ("": none).
	wwwAuthenticate string
	// raw, when set, is the body in another shape than OpenAI's (vLLM's own errors).
	raw []byte
}

// Refusal is a refusal as a front door that is not the router's own sends it.
type Refusal struct {
	Status int
	// Headers are the answer's headers besides Content-Type (application/json).
	Headers map[string]string
	Body    []byte
	// Reason is why, as the router's errors metric labels it.
	Reason string
}

func (f *refusal) body() []byte {
	if f.raw != nil {
		return f.raw
	}
	return oai.ErrorBody(f.errType, f.msg, f.code)
}

func (f *refusal) headers() map[string]string {
	h := map[string]string{}
	if f.retryAfter > 0 {
		h["Retry-After"] = strconv.Itoa(f.retryAfter)
	}
	if f.wwwAuthenticate != "" {
		h["WWW-Authenticate"] = f.wwwAuthenticate
	}
	return h
}

// export is f as another front door sends it.
func (f *refusal) export() *Refusal {
	return &Refusal{Status: f.status, Headers: f.headers(), Body: f.body(), Reason: f.reason}
}

// writeTo answers the router's client with f.
func (f *refusal) writeTo(ctx *fasthttp.RequestCtx) {
	ctx.Response.Reset()
	ctx.SetStatusCode(f.status)
	ctx.SetContentType("application/json")
	for k, v := range f.headers() {
		ctx.Response.Header.Set(k, v)
	}
	ctx.SetBody(f.body())
}

// refuse counts f in the errors metric and answers the router's client with it.
func (px *Proxy) refuse(ctx *fasthttp.RequestCtx, f *refusal) {
	px.met.fail(f.reason, f.service)
	f.writeTo(ctx)
}
