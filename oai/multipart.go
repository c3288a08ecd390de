package oai

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"strconv"
	"strings"
)

// AudioRequest is what routing needs from a transcription or translation request
// (vLLM's TranscriptionRequest and TranslationRequest, multipart/form-data as OpenAI's
// audio API takes them): the model, the prompt text, and the audio's size and estimated
// length.
type AudioRequest struct {
	Model, Prompt string
	Stream        bool
	// FileBytes is the size of the file part; Seconds the audio's length: exact for PCM
	// WAV (from its header), else estimated at 128 kbit/s, a common MP3 and M4A rate.
	FileBytes int
	Seconds   float64
}

// maxFormField bounds a form field other than the file: a model name, a prompt, a language.
const maxFormField = 1 << 20

// compressedBytesPerSecond is 128 kbit/s, the length estimate of a compressed file.
const compressedBytesPerSecond = 16000

// ParseAudioRequest reads a multipart/form-data audio request. The file part is scanned in
// place (its bytes are counted, never copied); the other fields are read whole up to 1 MiB.
func ParseAudioRequest(body []byte, contentType string) (AudioRequest, error) {
	var r AudioRequest
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return r, bad("an audio request must be multipart/form-data with a boundary (OpenAI's audio API), got Content-Type %q", contentType)
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	sawFile := false
	for {
		p, err := mr.NextRawPart() // raw: a field's bytes as sent, no transfer decoding
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r, bad("multipart body: %v", err)
		}
		name := p.FormName()
		if name == "file" {
			sawFile = true
			var head [44]byte
			n, _ := io.ReadFull(p, head[:])
			rest, err := io.Copy(io.Discard, p)
			if err != nil {
				return r, bad("multipart body: file: %v", err)
			}
			r.FileBytes = n + int(rest)
			r.Seconds = audioSeconds(head[:n], r.FileBytes)
			continue
		}
		v, err := io.ReadAll(io.LimitReader(p, maxFormField+1))
		if err != nil {
			return r, bad("multipart body: %s: %v", name, err)
		}
		if len(v) > maxFormField {
			return r, bad("form field %q is over %d bytes", name, maxFormField)
		}
		switch name {
		case "model":
			r.Model = strings.TrimSpace(string(v))
		case "prompt":
			r.Prompt = string(v)
		case "stream":
			if b, err := strconv.ParseBool(strings.TrimSpace(string(v))); err == nil {
				r.Stream = b
			} else {
				return r, bad("form field 'stream' must be true or false, got %q", v)
			}
		}
	}
	if !sawFile {
		return r, bad("'file' is required: the audio, as a form file field")
	}
	return r, nil
}

// audioSeconds is a file's audio length: from a canonical PCM WAV header (RIFF…WAVE, its
// byte rate at offset 28), else estimated from its size.
func audioSeconds(head []byte, size int) float64 {
	if len(head) == 44 && string(head[0:4]) == "RIFF" && string(head[8:12]) == "WAVE" {
		if rate := binary.LittleEndian.Uint32(head[28:32]); rate > 0 {
			return float64(size-44) / float64(rate)
		}
	}
	return float64(size) / compressedBytesPerSecond
}
