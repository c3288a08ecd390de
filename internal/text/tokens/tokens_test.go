package tokens

import (
	"strings"
	"testing"
)

func TestBPECountsKnownStrings(t *testing.T) {
	b, err := NewBPE()
	if err != nil {
		t.Fatal(err)
	}
	// Reference counts from OpenAI's tiktoken (cl100k_base).
	for text, want := range map[string]int{
		"hello world": 2,
		"":            0,
		"The quick brown fox jumps over the lazy dog.": 10,
	} {
		if got := b.Count(text); got != want {
			t.Errorf("Count(%q) = %d, want %d", text, got, want)
		}
	}
	ids := b.Encode(nil, "hello world")
	if len(ids) != 2 || ids[0] != 15339 || ids[1] != 1917 {
		t.Errorf("Encode(hello world) = %v, want [15339 1917]", ids)
	}
}

func TestApproxIsCloseToBPEOnEnglish(t *testing.T) {
	b, err := NewBPE()
	if err != nil {
		t.Fatal(err)
	}
	exact, approx := b.Count(prose), Approx{BytesPerToken: 4}.Count(prose)
	if r := float64(approx) / float64(exact); r < 0.7 || r > 1.4 {
		t.Errorf("approx %d vs bpe %d: ratio %.2f outside [0.7, 1.4]", approx, exact, r)
	}
}

// prose is a paragraph of ordinary English (from this project's design brief).
const prose = `Arbiter serves one LLM behind one OpenAI-compatible endpoint while its vLLM replicas live
wherever GPU capacity is cheapest right now: a local machine, a Kubernetes cluster, AWS, GCP,
Lambda, RunPod, spot or reserved. It keeps a latency SLO and spends as little as it can.
Application developers point any OpenAI client at one URL, streaming or not. Platform engineers
write a service file and run a few commands; on-call engineers look at the cost per million
tokens, the attainment of the latency objective, the share of spot capacity and the preemptions.`

func BenchmarkBPE(b *testing.B) {
	c, _ := NewBPE()
	text := strings.Repeat("Serving large language models across clouds with spot instances saves money. ", 50)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		c.Count(text)
	}
}

func BenchmarkApprox(b *testing.B) {
	text := strings.Repeat("Serving large language models across clouds with spot instances saves money. ", 50)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Approx{BytesPerToken: 4}.Count(text)
	}
}
