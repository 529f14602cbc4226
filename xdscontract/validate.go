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
//
// The walk enters only the fields whose message type can hold an Any at
// some depth (anyReach): in a ClusterLoadAssignment that leaves each
// endpoint's Metadata (typed_filter_metadata) and skips its Endpoint and
// filter_metadata Structs, which a reflective walk of every field made
// most of a data plane's cost of a large EDS response.
func ValidateDeep(m proto.Message) error {
	return validateDeep(m, anyReach{})
}

func validateDeep(m proto.Message, reach anyReach) error {
	if err := validateOne(m); err != nil {
		return err
	}
	return walkAnys(m.ProtoReflect(), reach, func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%w: Any %s inside %s: %w", ErrInvalidResource, a.GetTypeUrl(), m.ProtoReflect().Descriptor().FullName(), err)
		}
		return validateDeep(inner, reach)
	})
}

// anyReach memoises, for one ValidateDeep call, whether a message type
// can hold an Any at any depth (through its fields, map values and
// lists; an Any's own content is another type, validated on its own).
// Extension fields are not in a descriptor's fields: walkAnys enters a
// populated one whatever its type (the xDS API is proto3, which has none
// outside options).
type anyReach map[protoreflect.FullName]bool

// fieldMessage is the message type a field holds (a map's value type), nil
// for a scalar.
func fieldMessage(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// can reports whether a message of type md can hold an Any. It collects
// the types reachable from md not yet known, then marks, until nothing
// changes, those with a field of type Any or of a type marked: a fixed
// point, so recursive types (Struct holds Value holds Struct) come out
// right.
func (r anyReach) can(md protoreflect.MessageDescriptor) bool {
	if md.FullName() == anyFullName {
		return true
	}
	if v, ok := r[md.FullName()]; ok {
		return v
	}
	var graph []protoreflect.MessageDescriptor
	seen := map[protoreflect.FullName]bool{}
	for stack := []protoreflect.MessageDescriptor{md}; len(stack) > 0; {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, known := r[n.FullName()]; known || seen[n.FullName()] || n.FullName() == anyFullName {
			continue
		}
		seen[n.FullName()] = true
		graph = append(graph, n)
		fields := n.Fields()
		for i := range fields.Len() {
			if c := fieldMessage(fields.Get(i)); c != nil {
				stack = append(stack, c)
			}
		}
	}
	holds := map[protoreflect.FullName]bool{}
	for changed := true; changed; {
		changed = false
		for _, n := range graph {
			if holds[n.FullName()] {
				continue
			}
			fields := n.Fields()
			for i := range fields.Len() {
				c := fieldMessage(fields.Get(i))
				if c != nil && (c.FullName() == anyFullName || holds[c.FullName()] || r[c.FullName()]) {
					holds[n.FullName()], changed = true, true
					break
				}
			}
		}
	}
	for _, n := range graph {
		r[n.FullName()] = holds[n.FullName()]
	}
	return r[md.FullName()]
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
// passing through another Any. It skips the fields whose type cannot hold
// one (reach).
func walkAnys(m protoreflect.Message, reach anyReach, fn func(*anypb.Any) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if c := fieldMessage(fd); c == nil || (!fd.IsExtension() && !reach.can(c)) {
			return true
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = visit(mv.Message(), reach, fn)
				return err == nil
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = visit(l.Get(i).Message(), reach, fn)
			}
		case fd.Message() != nil:
			err = visit(v.Message(), reach, fn)
		}
		return err == nil
	})
	return err
}

func visit(m protoreflect.Message, reach anyReach, fn func(*anypb.Any) error) error {
	if m.Descriptor().FullName() == anyFullName {
		a, ok := m.Interface().(*anypb.Any)
		if !ok {
			return fmt.Errorf("%w: Any of unexpected Go type %T", ErrInvalidResource, m.Interface())
		}
		return fn(a)
	}
	return walkAnys(m, reach, fn)
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
