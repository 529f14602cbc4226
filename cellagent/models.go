package cellagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// maxModelIDLen bounds a model id taken from /v1/models.
const maxModelIDLen = 512

// Capability is what the replica serves, from /v1/models.
type Capability struct {
	// Model is the served model id.
	Model string `json:"model"`
	// MaxModelLen is the context length in tokens; 0 when unknown.
	MaxModelLen uint32 `json:"max_model_len"`
}

// ModelsSample is a parsed /v1/models answer.
type ModelsSample struct {
	Capability
	// Invalid describes each value dropped as invalid.
	Invalid []string
}

type modelsDoc struct {
	Data []struct {
		ID          string          `json:"id"`
		Parent      *string         `json:"parent"`
		MaxModelLen json.RawMessage `json:"max_model_len"`
	} `json:"data"`
}

// ParseModels parses vLLM's OpenAI-compatible /v1/models answer and returns
// the base model: the first entry without a parent (LoRA adapters name their
// base model as parent), else the first entry. It returns an error wrapping
// ErrParse when the body is not such a document or lists no model. A
// max_model_len that is not an integer in [1, 2^32) is dropped (0) and
// listed in Invalid.
func ParseModels(body []byte) (ModelsSample, error) {
	var doc modelsDoc
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&doc); err != nil {
		return ModelsSample{}, fmt.Errorf("%w: /v1/models: %v", ErrParse, err)
	}
	if len(doc.Data) == 0 {
		return ModelsSample{}, fmt.Errorf("%w: /v1/models lists no model", ErrParse)
	}
	pick := 0
	for i, d := range doc.Data {
		if d.Parent == nil || *d.Parent == "" {
			pick = i
			break
		}
	}
	d := doc.Data[pick]
	var out ModelsSample
	var iv invalids
	switch {
	case d.ID == "":
		return ModelsSample{}, fmt.Errorf("%w: /v1/models entry without id", ErrParse)
	case len(d.ID) > maxModelIDLen:
		return ModelsSample{}, fmt.Errorf("%w: /v1/models id longer than %d bytes", ErrParse, maxModelIDLen)
	case !utf8.ValidString(d.ID) || strings.ContainsFunc(d.ID, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return ModelsSample{}, fmt.Errorf("%w: /v1/models id %q has control characters or bad UTF-8", ErrParse, d.ID)
	}
	out.Model = d.ID
	if raw := bytes.TrimSpace(d.MaxModelLen); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		var n float64
		if err := json.Unmarshal(raw, &n); err != nil {
			iv.addf("max_model_len=%.40s (not a number)", raw)
		} else if n < 1 || n > math.MaxUint32 || n != math.Trunc(n) {
			iv.add("max_model_len", n, "not an integer in [1, 2^32)")
		} else {
			out.MaxModelLen = uint32(n)
		}
	}
	out.Invalid = iv
	return out, nil
}
