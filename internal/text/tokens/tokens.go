// Package tokens counts and splits text into tokens for prompt-length prediction and prefix
// hashing. No model tokenizer can be downloaded here, so the BPE counter uses OpenAI's
// cl100k_base vocabulary, which ships inside its Go module: Llama 3's 128k vocabulary was
// built by extending cl100k_base, so counts on English and code agree closely.
// Approx is a byte-ratio estimate for hot paths that cannot afford BPE.
package tokens

import (
	"fmt"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// Counter turns text into token ids. Implementations are safe for concurrent use.
type Counter interface {
	// Encode appends the token ids of text to dst.
	Encode(dst []int, text string) []int
	// Count returns the number of tokens in text.
	Count(text string) int
}

// BPE is a byte-pair-encoding counter over cl100k_base.
type BPE struct{ enc *tiktoken.Tiktoken }

var (
	bpeOnce sync.Once
	bpe     *BPE
	bpeErr  error
)

// NewBPE returns the shared cl100k_base counter; the vocabulary is parsed once per process
// (about 100k entries), on first use.
func NewBPE() (*BPE, error) {
	bpeOnce.Do(func() {
		// tiktoken-go keeps its loader in a package variable; the offline loader reads the
		// vocabulary embedded in tiktoken-go-loader instead of downloading it.
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		enc, err := tiktoken.GetEncoding("cl100k_base")
		if err != nil {
			bpeErr = fmt.Errorf("load cl100k_base: %w", err)
			return
		}
		bpe = &BPE{enc: enc}
	})
	return bpe, bpeErr
}

// Encode implements Counter.
func (b *BPE) Encode(dst []int, text string) []int {
	return append(dst, b.enc.EncodeOrdinary(text)...)
}

// Count implements Counter.
func (b *BPE) Count(text string) int { return len(b.enc.EncodeOrdinary(text)) }

// Decode returns the text of token ids; ids outside the vocabulary decode to nothing.
func (b *BPE) Decode(ids []int) string { return b.enc.Decode(ids) }

// Approx estimates tokens as one per BytesPerToken bytes (4 is typical of English for BPE
// vocabularies of 100k+ entries); its "ids" are hashes of those byte runs, stable enough for
// prefix hashing.
type Approx struct{ BytesPerToken int }

// Encode implements Counter.
func (a Approx) Encode(dst []int, text string) []int {
	n := a.width()
	for i := 0; i < len(text); i += n {
		end := min(i+n, len(text))
		h := 0
		for j := i; j < end; j++ {
			h = h*31 + int(text[j])
		}
		dst = append(dst, h&0x7fffffff)
	}
	return dst
}

// Count implements Counter.
func (a Approx) Count(text string) int {
	n := a.width()
	return (len(text) + n - 1) / n
}

func (a Approx) width() int { return max(a.BytesPerToken, 1) }

// New returns the counter named "bpe" or "approx".
func New(name string) (Counter, error) {
	switch name {
	case "bpe", "":
		return NewBPE()
	case "approx":
		return Approx{BytesPerToken: 4}, nil
	}
	return nil, fmt.Errorf("unknown tokenizer %q: want bpe or approx", name)
}
