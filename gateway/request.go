package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// maxModelNameLen bounds the model name taken from a body.
const maxModelNameLen = 256

// BodyModel returns the top-level "model" of an OpenAI request body ("" when
// absent or null). A body that is not a JSON object, or whose model is not
// a string, is an error wrapping ErrBadRequest.
//
// It scans the object's structure without decoding the other members, so a
// long prompt costs a few memchr calls rather than a full JSON decode; the
// engine behind validates the body in full. On valid JSON it agrees with
// encoding/json (a repeated key: the last one wins); on invalid JSON it
// either fails or returns what a lenient reader would.
func BodyModel(body []byte) (string, error) {
	s := scanner{b: body}
	s.ws()
	if !s.eat('{') {
		return "", fmt.Errorf("%w: body is not a JSON object", ErrBadRequest)
	}
	var model string
	s.ws()
	if s.eat('}') {
		return "", s.end()
	}
	for {
		s.ws()
		key, ok := s.str()
		if !ok {
			return "", fmt.Errorf("%w: body is not a JSON object: bad member name at byte %d", ErrBadRequest, s.i)
		}
		s.ws()
		if !s.eat(':') {
			return "", fmt.Errorf("%w: body is not a JSON object: missing ':' at byte %d", ErrBadRequest, s.i)
		}
		s.ws()
		if isModelKey(key) {
			switch {
			case s.lit("null"):
				model = ""
			case s.peek() == '"':
				raw, ok := s.str()
				if !ok {
					return "", fmt.Errorf("%w: model is not a valid JSON string", ErrBadRequest)
				}
				if err := json.Unmarshal(raw, &model); err != nil {
					return "", fmt.Errorf("%w: model is not a valid JSON string", ErrBadRequest)
				}
			default:
				return "", fmt.Errorf("%w: model must be a string", ErrBadRequest)
			}
		} else if !s.skipValue(0) {
			return "", fmt.Errorf("%w: body is not a JSON object: bad value at byte %d", ErrBadRequest, s.i)
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if !s.eat('}') {
			return "", fmt.Errorf("%w: body is not a JSON object: expected ',' or '}' at byte %d", ErrBadRequest, s.i)
		}
		if err := s.end(); err != nil {
			return "", err
		}
		if len(model) > maxModelNameLen {
			return "", fmt.Errorf("%w: model name longer than %d bytes", ErrBadRequest, maxModelNameLen)
		}
		return model, nil
	}
}

// isModelKey reports whether a raw JSON member name (quotes included)
// decodes to "model". encoding/json matches member names to struct fields
// case-insensitively; OpenAI servers do not, so only the exact name counts,
// escapes decoded.
func isModelKey(raw []byte) bool {
	if string(raw) == `"model"` {
		return true
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return false
	}
	var k string
	return json.Unmarshal(raw, &k) == nil && k == "model"
}

// maxDepth bounds the nesting skipValue follows.
const maxDepth = 512

// scanner walks JSON text; every method leaves i after what it consumed.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) lit(word string) bool {
	if bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		s.i += len(word)
		return true
	}
	return false
}

// end checks that only whitespace follows.
func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return fmt.Errorf("%w: body is not a JSON object: trailing data at byte %d", ErrBadRequest, s.i)
	}
	return nil
}

// str consumes a string and returns it raw, quotes included. It checks the
// escapes' shape but leaves decoding to the caller.
func (s *scanner) str() ([]byte, bool) {
	start := s.i
	if !s.eat('"') {
		return nil, false
	}
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			return nil, false
		}
		seg := s.b[s.i : s.i+j]
		for k := 0; k < len(seg); k++ {
			c := seg[k]
			if c < 0x20 {
				return nil, false // control characters must be escaped
			}
			if c == '\\' {
				k++
				if k == len(seg) {
					break // escaped quote: the string goes on
				}
				switch seg[k] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				case 'u':
					if k+4 >= len(seg) {
						return nil, false // hex digits are never quotes
					}
					for _, h := range seg[k+1 : k+5] {
						if !isHex(h) {
							return nil, false
						}
					}
					k += 4
				default:
					return nil, false
				}
			}
		}
		// The quote at j ends the string unless an odd run of backslashes
		// precedes it.
		n := 0
		for k := len(seg) - 1; k >= 0 && seg[k] == '\\'; k-- {
			n++
		}
		s.i += j + 1
		if n%2 == 0 {
			return s.b[start:s.i], true
		}
	}
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// skipValue consumes one value.
func (s *scanner) skipValue(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.peek(); {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '{' || c == '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		s.i++
		s.ws()
		if s.eat(closer) {
			return true
		}
		for {
			s.ws()
			if c == '{' {
				if _, ok := s.str(); !ok {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.skipValue(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat(closer)
		}
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		for s.i < len(s.b) && strings.IndexByte("+-.eE0123456789", s.b[s.i]) >= 0 {
			s.i++
		}
		return json.Valid(s.b[start:s.i])
	}
	return false
}

// requestView is what the route matcher sees of a request: its headers,
// with ModelHeader filled from the body's model when the client did not
// send it, and content-length set to the body's length (also for chunked
// requests, where Envoy would see no content-length). The routes turn the
// length into a token need at xdscontract.BytesPerToken bytes per token when
// x-isobar-prompt-tokens is absent.
type requestView struct {
	r             *http.Request
	modelHeader   string
	model         string // from the header or the body
	contentLength string
}

func (v *requestView) Header(name string) (string, bool) {
	switch name {
	case ":path":
		return v.r.URL.RequestURI(), true
	case ":method":
		return v.r.Method, true
	case ":authority", "host":
		return v.r.Host, true
	case ":scheme":
		if v.r.TLS != nil {
			return "https", true
		}
		return "http", true
	case "content-length":
		return v.contentLength, true
	case v.modelHeader:
		if v.model != "" {
			return v.model, true
		}
	}
	vals := v.r.Header.Values(name)
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return vals[0], true
	}
	return strings.Join(vals, ","), true
}

func newRequestView(r *http.Request, modelHeader, model string, bodyLen int) *requestView {
	return &requestView{r: r, modelHeader: modelHeader, model: model, contentLength: strconv.Itoa(bodyLen)}
}
