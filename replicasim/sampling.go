package replicasim

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/oai"
)

// The vLLM release whose behaviour the simulator matches; each rule below cites its source
// file in that release.
const vllmVersion = "0.11.0"

// maxLogprobs is vLLM's default --max-logprobs (vllm/config/model.py, max_logprobs = 20).
const maxLogprobs = 20

// vocabSize is Llama 3's vocabulary, the models the built-in profiles measure.
const vocabSize = 128256

// sampling is the part of a request's sampling parameters that changes what the simulator
// answers: how many choices, and whether each token carries log-probabilities.
type sampling struct {
	n int
	// logprobs: -1 for none; else the number of alternatives per token (completions'
	// integer logprobs, or chat's top_logprobs when logprobs is true).
	logprobs int
	// echo prepends the prompt to a completion's text, or a chat's last message to the
	// answer when that message is the answer's own role (chatEcho).
	echo bool
}

// parseSampling reads and checks n, temperature, logprobs, top_logprobs and echo with vLLM's
// rules and messages (vllm/sampling_params.py SamplingParams._verify_args;
// vllm/entrypoints/openai/protocol.py ChatCompletionRequest.check_logprobs; the max_logprobs
// check in vllm/v1/engine/processor.py).
func parseSampling(v *fastjson.Value, kind oai.Kind) (sampling, error) {
	sp := sampling{n: 1, logprobs: -1}
	num := func(key string) (*fastjson.Value, bool) {
		x := v.Get(key)
		return x, x != nil && x.Type() != fastjson.TypeNull
	}
	if x, ok := num("n"); ok {
		n, err := x.Int()
		if err != nil {
			return sp, fmt.Errorf("'n' must be an integer")
		}
		if n < 1 {
			return sp, fmt.Errorf("n must be at least 1, got %d.", n)
		}
		sp.n = n
	}
	temperature := 1.0
	if x, ok := num("temperature"); ok {
		t, err := x.Float64()
		if err != nil {
			return sp, fmt.Errorf("'temperature' must be a number")
		}
		if t < 0 {
			return sp, fmt.Errorf("temperature must be non-negative, got %s.", pyFloat(t))
		}
		temperature = t
	}
	if temperature < 1e-5 && sp.n > 1 {
		return sp, fmt.Errorf("n must be 1 when using greedy sampling, got %d.", sp.n)
	}
	switch kind {
	case oai.Completion:
		if x, ok := num("logprobs"); ok {
			k, err := x.Int()
			if err != nil {
				return sp, fmt.Errorf("'logprobs' must be an integer")
			}
			if k < 0 && k != -1 {
				return sp, fmt.Errorf("logprobs must be non-negative or -1, got %d.", k)
			}
			if k == -1 {
				k = vocabSize // -1 asks for the whole vocabulary
			}
			sp.logprobs = k
		}
	case oai.Chat:
		want := false
		if x, ok := num("logprobs"); ok {
			b, err := x.Bool()
			if err != nil {
				return sp, fmt.Errorf("'logprobs' must be a boolean")
			}
			want = b
		}
		top := 0
		if x, ok := num("top_logprobs"); ok {
			k, err := x.Int()
			if err != nil {
				return sp, fmt.Errorf("'top_logprobs' must be an integer")
			}
			if k < 0 {
				return sp, fmt.Errorf("`top_logprobs` must be a positive value.")
			}
			if k > 0 && !want {
				return sp, fmt.Errorf("when using `top_logprobs`, `logprobs` must be set to true.")
			}
			top = k
		}
		if want {
			sp.logprobs = top
		}
	}
	if x, ok := num("echo"); ok {
		b, err := x.Bool()
		if err != nil {
			return sp, fmt.Errorf("'echo' must be a boolean")
		}
		sp.echo = b
	}
	if sp.logprobs > maxLogprobs {
		return sp, fmt.Errorf("Requested sample logprobs of %d, which is greater than max allowed: %d", sp.logprobs, maxLogprobs)
	}
	return sp, nil
}

// pyFloat formats a float as Python's repr does for the values vLLM puts in messages.
func pyFloat(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

// vllmError answers with vLLM's error body (vllm/entrypoints/openai/protocol.py ErrorResponse
// and ErrorInfo; serving_engine.py create_error_response): the OpenAI shape, with the HTTP
// status as an integer code and the exception's name as the type.
func vllmError(ctx *fasthttp.RequestCtx, status int, message string) {
	typ := http.StatusText(status) // vLLM's HTTPException handler uses the status phrase
	switch status {
	case fasthttp.StatusBadRequest:
		typ = "BadRequestError"
	case fasthttp.StatusNotFound:
		typ = "NotFoundError"
	}
	vllmTypedError(ctx, status, typ, message)
}

// vllmTypedError is vLLM's error with a type of its own (InvalidUserInput for a LoRA load's
// bad input, serving_models.py).
func vllmTypedError(ctx *fasthttp.RequestCtx, status int, typ, message string) {
	b := oai.ErrorBody(typ, message, "")
	b = append(b[:len(b)-len(`null}}`)], strconv.Itoa(status)...)
	b = append(b, "}}"...)
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// chatEcho is what vLLM echoes before a chat answer with echo set
// (vllm/entrypoints/openai/serving_chat.py, chat_completion_stream_generator and
// chat_completion_full_generator): the last message's content, if that message has the
// role the answer takes (get_chat_request_role: "assistant", or the last message's own role
// when add_generation_prompt is false, so then always); a content given as parts is their
// texts joined by newlines.
func chatEcho(v *fastjson.Value) string {
	msgs := v.GetArray("messages")
	if len(msgs) == 0 {
		return ""
	}
	last := msgs[len(msgs)-1]
	role := "assistant"
	if agp := v.Get("add_generation_prompt"); agp != nil && agp.Type() == fastjson.TypeFalse {
		role = string(last.GetStringBytes("role"))
	}
	if string(last.GetStringBytes("role")) != role {
		return ""
	}
	return contentText(last.Get("content"), "\n")
}

// contentText is a chat message's text: its content string, or the texts of its parts
// joined by sep ("" for none).
func contentText(c *fastjson.Value, sep string) string {
	switch {
	case c == nil:
		return ""
	case c.Type() == fastjson.TypeString:
		return string(c.GetStringBytes())
	case c.Type() == fastjson.TypeArray:
		var parts []string
		for _, part := range c.GetArray() {
			if t := part.Get("text"); t != nil {
				parts = append(parts, string(t.GetStringBytes()))
			}
		}
		return strings.Join(parts, sep)
	}
	return ""
}
