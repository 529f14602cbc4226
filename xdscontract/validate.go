package xdscontract

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// ErrInvalidResource wraps every refusal of a resource by ValidateDeep.
// Test with errors.Is.
var ErrInvalidResource = errors.New("xdscontract: invalid resource")

// validator is implemented by every Envoy message (protoc-gen-validate).
type validator interface{ ValidateAll() error }

// anyFullName is the full name of google.protobuf.Any.
const anyFullName protoreflect.FullName = "google.protobuf.Any"

// ValidateDeep runs ValidateAll on m and on every message packed in an Any
// anywhere inside it, recursively; an Any of a type not linked into the
// binary fails. ValidateAll alone stops at an Any: it would pass an
// HttpConnectionManager without a route specifier, or a Router config with a
// bad field. Errors wrap ErrInvalidResource. The server runs it on what it
// builds; data planes run it on what they receive.
func ValidateDeep(m proto.Message) error {
	if err := validateOne(m); err != nil {
		return err
	}
	return walkAnys(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%w: Any %s inside %s: %w", ErrInvalidResource, a.GetTypeUrl(), m.ProtoReflect().Descriptor().FullName(), err)
		}
		return ValidateDeep(inner)
	})
}

func validateOne(m proto.Message) error {
	v, ok := m.(validator)
	if !ok {
		return nil
	}
	if err := v.ValidateAll(); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidResource, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// walkAnys calls fn for every populated Any reachable from m without
// passing through another Any.
func walkAnys(m protoreflect.Message, fn func(*anypb.Any) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = visit(mv.Message(), fn)
				return err == nil
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = visit(l.Get(i).Message(), fn)
			}
		case fd.Message() != nil:
			err = visit(v.Message(), fn)
		}
		return err == nil
	})
	return err
}

func visit(m protoreflect.Message, fn func(*anypb.Any) error) error {
	if m.Descriptor().FullName() == anyFullName {
		a, ok := m.Interface().(*anypb.Any)
		if !ok {
			return fmt.Errorf("%w: Any of unexpected Go type %T", ErrInvalidResource, m.Interface())
		}
		return fn(a)
	}
	return walkAnys(m, fn)
}

// MaxNameLen bounds a name or header name, in bytes.
const MaxNameLen = 256

// CheckName accepts names that are safe as xDS resource names, header values
// and metric label values: 1 to MaxNameLen visible ASCII characters. Both
// sides check with it the names they put into resources and headers (a
// region, a zone, a model, a cell id). field names the value in the error.
func CheckName(field, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("%s is longer than %d bytes", field, MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%s %q contains byte 0x%02x; use visible ASCII without spaces", field, s, c)
		}
	}
	return nil
}

// CheckHeaders accepts a model header and a hop header (the ModelHeader and
// HopHeader of the server's and of a data plane's configuration): each a
// lower-case HTTP/2 header name that is not a pseudo-header (Envoy and gRPC
// compare header names in lower case) of at most MaxNameLen bytes, neither
// one of the headers that context-class routing reads (PromptTokensHeader,
// content-length), nor one that the shed and residency routes read
// (CriticalityHeader, ResidencyHeader), nor HopAuthHeader, and the two
// different.
func CheckHeaders(modelHeader, hopHeader string) error {
	for _, h := range []struct{ field, v string }{{"ModelHeader", modelHeader}, {"HopHeader", hopHeader}} {
		if err := checkHeaderName(h.field, h.v); err != nil {
			return err
		}
	}
	if modelHeader == hopHeader {
		return fmt.Errorf("ModelHeader and HopHeader are both %q; they must differ", modelHeader)
	}
	for _, h := range []string{modelHeader, hopHeader} {
		if h == PromptTokensHeader || h == "content-length" {
			return fmt.Errorf("header %q is reserved for context-class routing; choose another ModelHeader/HopHeader", h)
		}
		if h == CriticalityHeader || h == ResidencyHeader {
			return fmt.Errorf("header %q is reserved for the criticality and residency routes; choose another ModelHeader/HopHeader", h)
		}
		if h == HopAuthHeader {
			return fmt.Errorf("header %q is reserved for the hop proof; choose another ModelHeader/HopHeader", h)
		}
	}
	return nil
}

func checkHeaderName(field, h string) error {
	if h == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(h) > MaxNameLen {
		return fmt.Errorf("%s is longer than %d bytes", field, MaxNameLen)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' {
			continue
		}
		return fmt.Errorf("%s %q is not a valid header name; use lower-case letters, digits, '-', '_' or '.'", field, h)
	}
	return nil
}
