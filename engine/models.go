package engine

import (
	"fmt"
	"slices"
	"strings"
)

// ModelShape is what a decoder-only transformer's step costs depend on: the fields of its
// published config.json (Hugging Face transformers' LlamaConfig, MistralConfig and
// Qwen2Config names in the comments). Weights are bf16 (2 bytes a parameter), as vLLM
// loads these checkpoints by default, or FP8 (see FP8).
type ModelShape struct {
	// Name is the short name profiles use (llama-3.1-8b).
	Name string
	// HF lists the Hugging Face ids of the checkpoints with this shape (base and instruct
	// share one config but for the chat template).
	HF []string
	// Source is the config.json the figures were read from.
	Source        string
	Layers        int  // num_hidden_layers
	Hidden        int  // hidden_size
	FFN           int  // intermediate_size (SwiGLU: three matrices of Hidden × FFN)
	Heads         int  // num_attention_heads
	KVHeads       int  // num_key_value_heads
	HeadDim       int  // head_dim, or hidden_size / num_attention_heads where absent
	Vocab         int  // vocab_size
	Context       int  // max_position_embeddings: vLLM's default max_model_len
	TiedEmbedding bool // tie_word_embeddings: the LM head reuses the input embedding
	// QKVBias: the query, key and value projections carry biases (Qwen2).
	QKVBias bool
	// PublishedParams is the parameter count the model card states (billions), a check on
	// Params: 0 where the card gives only a rounded name.
	PublishedParams float64
	// FP8 is the model's FP8 checkpoint (a name with the suffix -fp8, such as
	// llama-3.1-8b-fp8): the decoder layers' linear weights in FP8 (1 byte a parameter; the
	// embedding, LM head and norms stay 16-bit, as NVIDIA's ModelOpt and Neural Magic's FP8
	// checkpoints keep them) and the KV cache in FP8 (vLLM's kv_cache_dtype fp8, which
	// TensorRT-LLM's FP8 engines set as well). Its matrix multiplies run at the card's FP8
	// tensor rate where it has one (Ada, Hopper), else at the 16-bit rate with weights read
	// at 1 byte (Ampere: vLLM's FP8 weight-only Marlin kernels).
	FP8 bool
	// kv16 keeps an FP8 checkpoint's KV cache at 16 bits: vLLM's kv_cache_dtype "auto" on a
	// checkpoint that quantizes no KV (Neural Magic's FP8-dynamic ones).
	kv16 bool
}

// fp8Suffix marks a model's FP8 checkpoint in a model or profile name.
const fp8Suffix = "-fp8"

// fp8 is the FP8 checkpoint of m.
func (m ModelShape) fp8() ModelShape {
	m.FP8, m.Name, m.HF = true, m.Name+fp8Suffix, nil
	return m
}

// weightByte and kvByte are the bytes of one weight of a decoder layer and of one KV
// element.
func (m ModelShape) weightByte() float64 {
	if m.FP8 {
		return 1
	}
	return 2
}

func (m ModelShape) kvByte() int {
	if m.FP8 && !m.kv16 {
		return 1
	}
	return 2
}

// precision names the weights' type in messages.
func (m ModelShape) precision() string {
	if m.FP8 {
		return "FP8"
	}
	return "bf16"
}

// models are the shapes a profile can be generated for. Every figure is the model's own
// config.json on huggingface.co (the URL in Source), read 2026-11; the instruct and base
// checkpoints of each share one shape. The two measured shapes (llama-3.2-1b and
// llama-3.1-8b) match shared/data/gpu_profiles/README.md, whose weights and KV bytes per
// token TestModelShapesMatchTheMeasuredOnes checks.
var models = []ModelShape{
	{Name: "llama-2-7b", HF: []string{"meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"}, Source: "https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json",
		Layers: 32, Hidden: 4096, FFN: 11008, Heads: 32, KVHeads: 32, HeadDim: 128, Vocab: 32000, Context: 4096, PublishedParams: 6.74},
	{Name: "llama-3.2-1b", HF: []string{"meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"}, Source: "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
		Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, HeadDim: 64, Vocab: 128256, Context: 131072, TiedEmbedding: true, PublishedParams: 1.24},
	{Name: "llama-3.2-3b", HF: []string{"meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"}, Source: "https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json",
		Layers: 28, Hidden: 3072, FFN: 8192, Heads: 24, KVHeads: 8, HeadDim: 128, Vocab: 128256, Context: 131072, TiedEmbedding: true, PublishedParams: 3.21},
	{Name: "llama-3.1-8b", HF: []string{"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"}, Source: "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
		Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 128256, Context: 131072, PublishedParams: 8.03},
	{Name: "llama-3.1-70b", HF: []string{"meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct"}, Source: "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json",
		Layers: 80, Hidden: 8192, FFN: 28672, Heads: 64, KVHeads: 8, HeadDim: 128, Vocab: 128256, Context: 131072, PublishedParams: 70.6},
	{Name: "mistral-7b", HF: []string{"mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"}, Source: "https://huggingface.co/mistralai/Mistral-7B-Instruct-v0.3/blob/main/config.json",
		Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 32768, Context: 32768, PublishedParams: 7.25},
	{Name: "qwen2.5-7b", HF: []string{"Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"}, Source: "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json",
		Layers: 28, Hidden: 3584, FFN: 18944, Heads: 28, KVHeads: 4, HeadDim: 128, Vocab: 152064, Context: 32768, QKVBias: true, PublishedParams: 7.61},
	{Name: "qwen2.5-32b", HF: []string{"Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"}, Source: "https://huggingface.co/Qwen/Qwen2.5-32B-Instruct/blob/main/config.json",
		Layers: 64, Hidden: 5120, FFN: 27648, Heads: 40, KVHeads: 8, HeadDim: 128, Vocab: 152064, Context: 32768, QKVBias: true, PublishedParams: 32.8},
}

// ModelNames lists the short names of the model shapes, sorted.
func ModelNames() []string {
	out := make([]string, len(models))
	for i, m := range models {
		out[i] = m.Name
	}
	slices.Sort(out)
	return out
}

// LookupModel finds a model shape by short name (llama-3.1-8b) or Hugging Face id
// (meta-llama/Llama-3.1-8B-Instruct, see ModelShape.HF), case-insensitively.
func LookupModel(name string) (ModelShape, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if base, ok := strings.CutSuffix(n, fp8Suffix); ok && !strings.Contains(base, "/") {
		m, err := LookupModel(base)
		if err != nil || m.FP8 {
			return ModelShape{}, fmt.Errorf("unknown model %q: want one of %s, with %s for its FP8 checkpoint", name, strings.Join(ModelNames(), ", "), fp8Suffix)
		}
		return m.fp8(), nil
	}
	for _, m := range models {
		if n == m.Name || slices.ContainsFunc(m.HF, func(id string) bool { return strings.ToLower(id) == n }) {
			return m, nil
		}
	}
	return ModelShape{}, fmt.Errorf("unknown model %q: want one of %s, or one of their Hugging Face ids (such as meta-llama/Llama-3.1-8B-Instruct)", name, strings.Join(ModelNames(), ", "))
}

// Params is the parameter count computed from the shape.
func (m ModelShape) Params() float64 {
	return m.layerParams()*float64(m.Layers) + m.embedParams() + float64(m.Hidden) // + the final norm
}

func (m ModelShape) embedParams() float64 {
	e := float64(m.Vocab) * float64(m.Hidden)
	if !m.TiedEmbedding {
		e *= 2
	}
	return e
}

func (m ModelShape) layerParams() float64 {
	H, q, kv := float64(m.Hidden), float64(m.Heads*m.HeadDim), float64(m.KVHeads*m.HeadDim)
	p := H*q + 2*H*kv + q*H + 3*H*float64(m.FFN) + 2*H
	if m.QKVBias {
		p += q + 2*kv
	}
	return p
}

// WeightBytes is the weights in memory: bf16, or for an FP8 checkpoint the decoder
// layers' at 1 byte and the embedding, LM head and final norm at 2.
func (m ModelShape) WeightBytes() float64 {
	return m.weightByte()*m.layerParams()*float64(m.Layers) + 2*(m.embedParams()+float64(m.Hidden))
}

// KVBytesPerToken is one token's K and V over all layers, in bf16 (FP8 for an FP8
// checkpoint).
func (m ModelShape) KVBytesPerToken() int { return 2 * m.Layers * m.KVHeads * m.HeadDim * m.kvByte() }

// tokenFLOPs is the matrix-multiply work of one token through every layer (2 FLOPs a
// multiply-add), without attention over the context and without the LM head.
func (m ModelShape) tokenFLOPs() float64 { return 2 * m.layerParams() * float64(m.Layers) }

// headFLOPs is the LM head's work for one sampled token.
func (m ModelShape) headFLOPs() float64 { return 2 * float64(m.Vocab) * float64(m.Hidden) }
