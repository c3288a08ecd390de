package oai

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"
)

// Error types as OpenAI names them.
const (
	InvalidRequest = "invalid_request_error"
	NotFound       = "not_found_error"
	Authentication = "authentication_error"
	RateLimit      = "rate_limit_error"
	ServerError    = "server_error"
	Unavailable    = "service_unavailable_error"
	Timeout        = "timeout_error"
	// InsufficientQuota is OpenAI's type for a 429 of an exhausted quota ("You exceeded
	// your current quota…"), as distinct from a rate limit.
	InsufficientQuota = "insufficient_quota"
)

// ErrorBody returns OpenAI's error JSON: {"error":{"message","type","param","code"}}.
// code is omitted from the JSON as null when empty.
func ErrorBody(errType, message, code string) []byte {
	msg, _ := json.Marshal(message)
	b := make([]byte, 0, len(msg)+96)
	b = append(b, `{"error":{"message":`...)
	b = append(b, msg...)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, errType)
	b = append(b, `,"param":null,"code":`...)
	if code == "" {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendQuote(b, code)
	}
	return append(b, "}}"...)
}

// ErrorEvent is the SSE event a stream ends with when it fails after bytes were sent: the
// error object as a data event (what OpenAI clients raise), then the usual terminator.
func ErrorEvent(errType, message string) []byte {
	b := append([]byte("data: "), ErrorBody(errType, message, "")...)
	return append(b, "\n\ndata: [DONE]\n\n"...)
}

// ResponsesErrorEvent is the event a Responses stream ends with when it fails after bytes
// were sent: OpenAI's typed error event (event: error, type error, with code and message),
// which the SDKs raise; a Responses stream has no [DONE].
func ResponsesErrorEvent(code, message string) []byte {
	b := append([]byte("event: error\ndata: {\"type\":\"error\",\"code\":"), strconv.Quote(code)...)
	b = append(b, `,"message":`...)
	b = append(b, strconv.Quote(message)...)
	return append(b, ",\"param\":null}\n\n"...)
}

// WriteError replaces ctx's response with an OpenAI error.
func WriteError(ctx *fasthttp.RequestCtx, status int, errType, message string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(ErrorBody(errType, message, ""))
}
