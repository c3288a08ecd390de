package replicasim

import (
	"bytes"
	"fmt"
	"math"
	"mime"
	"mime/multipart"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/oai"
)

// Tasks, as vLLM's --task (now --runner and --convert) chooses them: what the served model
// does and which endpoints it answers (vllm/entrypoints/openai/api_server.py, 0.11). A
// model answers the others 400 "The model does not support … API".
const (
	TaskGenerate      = "generate"      // chat, completions, responses (and, as before tasks, embeddings)
	TaskEmbed         = "embed"         // embeddings, pooling, score and rerank by cosine similarity
	TaskClassify      = "classify"      // classify, pooling
	TaskScore         = "score"         // a cross-encoder (reranker): score, rerank, classify, pooling
	TaskTranscription = "transcription" // Whisper: audio transcriptions and translations
)

// TaskNames lists the tasks a simulated replica can serve.
var TaskNames = []string{TaskGenerate, TaskEmbed, TaskClassify, TaskScore, TaskTranscription}

// taskEndpoints is what each task answers, beside /tokenize and /detokenize (every model).
var taskEndpoints = map[string][]string{
	TaskGenerate:      {"generate", "embeddings"},
	TaskEmbed:         {"embeddings", "pooling", "score"},
	TaskClassify:      {"classify", "pooling"},
	TaskScore:         {"score", "classify", "pooling"},
	TaskTranscription: {"transcription"},
}

// supports reports whether the server's task answers an endpoint family; if not it answers
// vLLM's refusal and returns false.
func (s *Server) supports(ctx *fasthttp.RequestCtx, family, api string) bool {
	if slices.Contains(taskEndpoints[s.task()], family) {
		return true
	}
	vllmError(ctx, fasthttp.StatusBadRequest, "The model does not support "+api)
	return false
}

func (s *Server) task() string {
	if s.cfg.Task == "" {
		return TaskGenerate
	}
	return s.cfg.Task
}

// prefill sleeps for a request's prefill of counts tokens each, as embed does: pooling runs
// the prompt through the model once, with no decode.
func (s *Server) prefill(counts []int) {
	if s.cfg.Profile == nil || s.cfg.Echo {
		return
	}
	var ms float64
	for _, n := range counts {
		ms += s.cfg.Profile.PrefillMs(n, 0)
	}
	time.Sleep(time.Duration(ms * float64(time.Millisecond)))
}

// textTokens counts a text as the model's prompt (BOS and its tokens).
func (s *Server) textTokens(text string) int {
	r := oai.Request{Prompt: text}
	return len(s.promptIDs(&r, nil))
}

// texts reads a string or a list of strings (the checks are oai's).
func texts(v *fastjson.Value) []string {
	if v.Type() == fastjson.TypeString {
		return []string{string(v.GetStringBytes())}
	}
	if v.Type() == fastjson.TypeObject {
		var sb strings.Builder
		for _, p := range v.GetArray("content") {
			sb.Write(p.GetStringBytes("text"))
		}
		return []string{sb.String()}
	}
	var out []string
	for _, it := range v.GetArray() {
		out = append(out, string(it.GetStringBytes()))
	}
	return out
}

// relevance is the simulated model's score of a pair: the share of the second text's words
// found in the first, nudged by a hash so that ties break the same way every time; in [0, 1].
func relevance(a, b string) float64 {
	aw := map[string]bool{}
	for _, w := range strings.Fields(strings.ToLower(a)) {
		aw[strings.Trim(w, ".,;:?!")] = true
	}
	bw := strings.Fields(strings.ToLower(b))
	hit := 0
	for _, w := range bw {
		if aw[strings.Trim(w, ".,;:?!")] {
			hit++
		}
	}
	jitter := float64(xxhash.Sum64String(a+"\x00"+b)%1000) / 1e5
	if len(bw) == 0 {
		return jitter
	}
	return math.Min(1, float64(hit)/float64(len(bw))*0.99+jitter)
}

// scorePairs pairs text_1 with text_2 as vLLM does (one with many, or in order) and scores
// them; the tokens are each pair's, as a cross-encoder reads the pair as one sequence.
func (s *Server) scorePairs(ctx *fasthttp.RequestCtx, t1, t2 []string) ([]float64, int, bool) {
	if len(t1) != 1 && len(t1) != len(t2) {
		vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("text_1 has %d items and text_2 %d: give one text_1, or as many as text_2", len(t1), len(t2)))
		return nil, 0, false
	}
	scores := make([]float64, len(t2))
	counts := make([]int, len(t2))
	total := 0
	for i, b := range t2 {
		a := t1[0]
		if len(t1) > 1 {
			a = t1[i]
		}
		scores[i] = relevance(a, b)
		counts[i] = s.textTokens(a) + s.textTokens(b)
		if counts[i] > s.maxModelLen() {
			vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input for score. Please reduce the length of the input.", s.maxModelLen(), counts[i]))
			return nil, 0, false
		}
		total += counts[i]
	}
	s.prefill(counts)
	s.met.promptTokens.Add(float64(total))
	return scores, total, true
}

// rerank answers /rerank, /v1/rerank and /v2/rerank as vLLM's RerankResponse: results
// ordered by relevance_score, at most top_n of them, and usage with total_tokens alone.
func (s *Server) rerank(ctx *fasthttp.RequestCtx) {
	if !s.supports(ctx, "score", "Rerank (Score) API") {
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, oai.Rerank)
	if !ok {
		return
	}
	docs := texts(v.Get("documents"))
	scores, total, ok := s.scorePairs(ctx, texts(v.Get("query")), docs)
	if !ok {
		return
	}
	order := make([]int, len(docs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return -cmpFloat(scores[a], scores[b]) })
	if n := v.GetInt("top_n"); n > 0 && n < len(order) {
		order = order[:n]
	}
	b := fmt.Appendf(nil, `{"id":"rerank-%d","model":%q,"usage":{"total_tokens":%d},"results":[`, s.reqSeq.Add(1), req.Model, total)
	for j, i := range order {
		if j > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"index":%d,"document":{"text":%s},"relevance_score":%s}`, i, strconv.Quote(docs[i]), strconv.FormatFloat(scores[i], 'g', -1, 64))
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, "]}"...))
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// score answers /score and /v1/score as vLLM's ScoreResponse.
func (s *Server) score(ctx *fasthttp.RequestCtx) {
	if !s.supports(ctx, "score", "Score API") {
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, oai.Score)
	if !ok {
		return
	}
	scores, total, ok := s.scorePairs(ctx, texts(v.Get("text_1")), texts(v.Get("text_2")))
	if !ok {
		return
	}
	b := fmt.Appendf(nil, `{"id":"score-%d","object":"list","created":%d,"model":%q,"data":[`, s.reqSeq.Add(1), time.Now().Unix(), req.Model)
	for i, sc := range scores {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"index":%d,"object":"score","score":%s}`, i, strconv.FormatFloat(sc, 'g', -1, 64))
	}
	b = appendPoolingUsage(b, total)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func appendPoolingUsage(b []byte, total int) []byte {
	return fmt.Appendf(b, `],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":0,"prompt_tokens_details":null}}`, total, total)
}

// inputs reads a pooling or classify request's texts, each counted as a prompt.
func (s *Server) inputs(ctx *fasthttp.RequestCtx, v *fastjson.Value) ([]embeddingInput, []int, int, bool) {
	var ins []embeddingInput
	if msgs := v.Get("messages"); msgs != nil {
		var sb strings.Builder
		for _, m := range msgs.GetArray() {
			sb.WriteString(contentText(m.Get("content"), ""))
		}
		ins = []embeddingInput{{text: sb.String()}}
	} else {
		ins, _, _ = embeddingInputs(v)
	}
	counts := make([]int, len(ins))
	total := 0
	for i, in := range ins {
		one := oai.Request{Prompt: in.text, TokenIDs: in.ids}
		counts[i] = len(s.promptIDs(&one, nil))
		if counts[i] > s.maxModelLen() {
			vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input. Please reduce the length of the input.", s.maxModelLen(), counts[i]))
			return nil, nil, 0, false
		}
		total += counts[i]
	}
	s.prefill(counts)
	s.met.promptTokens.Add(float64(total))
	return ins, counts, total, true
}

// classifyLabels are the simulated classifier's classes.
var classifyLabels = [...]string{"negative", "positive"}

// classify answers /classify as vLLM's ClassificationResponse.
func (s *Server) classify(ctx *fasthttp.RequestCtx) {
	if !s.supports(ctx, "classify", "Classification API") {
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, oai.Classify)
	if !ok {
		return
	}
	ins, _, total, ok := s.inputs(ctx, v)
	if !ok {
		return
	}
	b := fmt.Appendf(nil, `{"id":"classify-%d","object":"list","created":%d,"model":%q,"data":[`, s.reqSeq.Add(1), time.Now().Unix(), req.Model)
	for i, in := range ins {
		if i > 0 {
			b = append(b, ',')
		}
		p := float64(xxhash.Sum64String(in.text)%1000) / 1000
		label := classifyLabels[0]
		if p >= 0.5 {
			label = classifyLabels[1]
		}
		b = fmt.Appendf(b, `{"index":%d,"label":%q,"probs":[%s,%s],"num_classes":2}`, i, label,
			strconv.FormatFloat(1-p, 'g', -1, 64), strconv.FormatFloat(p, 'g', -1, 64))
	}
	b = appendPoolingUsage(b, total)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// pooling answers /pooling as vLLM's PoolingResponse: each input's pooled hidden state (the
// simulator's unit vector, as its embeddings).
func (s *Server) pooling(ctx *fasthttp.RequestCtx) {
	if !s.supports(ctx, "pooling", "Pooling API") {
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, oai.Pooling)
	if !ok {
		return
	}
	ins, _, total, ok := s.inputs(ctx, v)
	if !ok {
		return
	}
	b := fmt.Appendf(nil, `{"id":"pool-%d","object":"list","created":%d,"model":%q,"data":[`, s.reqSeq.Add(1), time.Now().Unix(), req.Model)
	vec := make([]float32, s.cfg.EmbeddingDim)
	for i, in := range ins {
		if i > 0 {
			b = append(b, ',')
		}
		s.embedding(vec, in)
		b = fmt.Appendf(b, `{"index":%d,"object":"pooling","data":[`, i)
		for j, x := range vec {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendFloat(b, float64(x), 'g', -1, 32)
		}
		b = append(b, "]}"...)
	}
	b = appendPoolingUsage(b, total)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// transcribe answers /v1/audio/transcriptions and /v1/audio/translations as vLLM's
// TranscriptionResponse ({"text", "usage": {"type": "duration", "seconds"}}, the seconds
// rounded up) and TranslationResponse ({"text"}), or plain text with response_format text.
// The audio's length is read as the router reads it (oai.ParseAudioRequest); the encoder
// prefills 50 positions a second and the decoder writes about 3 tokens a second of speech.
func (s *Server) transcribe(ctx *fasthttp.RequestCtx, translate bool) {
	api := "Transcriptions API"
	if translate {
		api = "Translations API"
	}
	if !s.supports(ctx, "transcription", api) {
		return
	}
	if !ctx.IsPost() {
		vllmError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	ct := string(ctx.Request.Header.ContentType())
	ar, err := oai.ParseAudioRequest(ctx.PostBody(), ct)
	if err != nil {
		// FastAPI's Form() validation answers 422 for a missing or malformed form.
		vllmError(ctx, fasthttp.StatusUnprocessableEntity, strings.TrimPrefix(err.Error(), oai.ErrBadRequest.Error()+": "))
		return
	}
	if ar.Model != "" && ar.Model != s.cfg.Model {
		vllmError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", ar.Model))
		return
	}
	format := formField(ctx.PostBody(), ct, "response_format")
	if s.preFault(ctx, s.faults.take()) {
		return
	}
	secs := int(math.Ceil(ar.Seconds))
	out := max(1, int(math.Ceil(ar.Seconds*3)))
	if s.cfg.Profile != nil && !s.cfg.Echo {
		ms := s.cfg.Profile.PrefillMs(int(math.Ceil(ar.Seconds*50))+s.textTokens(ar.Prompt), 0)
		ms += float64(out) * s.cfg.Profile.DecodeMs(1, 1500)
		time.Sleep(time.Duration(ms * float64(time.Millisecond)))
	}
	var text strings.Builder
	for i := range out {
		text.WriteString(words[i%len(words)])
	}
	t := strings.TrimSpace(text.String())
	s.met.promptTokens.Add(math.Ceil(ar.Seconds * 50))
	if format == "text" {
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString(t)
		return
	}
	b := append([]byte(`{"text":`), strconv.Quote(t)...)
	if !translate {
		b = fmt.Appendf(b, `,"usage":{"type":"duration","seconds":%d}`, secs)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '}'))
}

// formField reads one small field of a multipart body ("" when absent).
func formField(body []byte, contentType, name string) string {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return ""
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextRawPart()
		if err != nil {
			return ""
		}
		if p.FormName() == name {
			var sb strings.Builder
			buf := make([]byte, 256)
			n, _ := p.Read(buf)
			sb.Write(buf[:n])
			return strings.TrimSpace(sb.String())
		}
	}
}
