package optimize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of the JSON input.
const (
	// MaxInputBytes caps what ReadInput reads.
	MaxInputBytes = 16 << 20
	// MaxRegionNameBytes caps a region name in the input.
	MaxRegionNameBytes = 128
)

// ErrInvalidInput is matched (errors.Is) by every error ParseInput and
// ReadInput return for input that is not a valid problem: malformed or
// oversized JSON, unknown fields, duplicate keys, out-of-range numbers.
// Its message is the underlying one alone, which names the offending
// field by its JSON path. ReadInput's reader errors do not match it.
var ErrInvalidInput = errors.New("optimize: invalid input")

// inputError marks an error as ErrInvalidInput without changing its text.
type inputError struct{ err error }

func (e inputError) Error() string        { return e.err.Error() }
func (e inputError) Unwrap() error        { return e.err }
func (e inputError) Is(target error) bool { return target == ErrInvalidInput }

// ReadInput reads one JSON problem from r, at most MaxInputBytes, and
// parses it with ParseInput. An error reading r is returned as is.
func ReadInput(r io.Reader) (Problem, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return Problem{}, err
	}
	if len(data) > MaxInputBytes {
		return Problem{}, inputError{fmt.Errorf("larger than %d bytes", MaxInputBytes)}
	}
	return ParseInput(data)
}

// ParseInput parses and checks one problem in the JSON input format of
// `isobar global plan`:
//
//	{"headroom": 0.9,
//	 "regions": [{"name": "a", "demand_rps": 90, "capacity_rps": 100,
//	              "engine_latency_ms": 300}, ...],
//	 "rtt_ms": {"a": {"b": 20, "c": 60}, "b": {"c": 30}}}
//
// headroom (default 0.9) must be in [MinHeadroom, 1]. Optional "beta",
// "k" (1 to MaxK) and "shed_penalty_ms" (above every engine_latency_ms)
// change the model. Demand and capacity are 0 to MaxValue requests/s; a
// region may be marked "down": true, and may give its demand as a list of
// slices by criticality and allowed regions instead of demand_rps (see
// ParseSlicedInput; ParseInput then sums them); a name is printable UTF-8 without
// spaces, at most MaxRegionNameBytes. RTT is symmetric: each pair is
// given once, in either direction (both directions must agree); a missing
// pair is unreachable.
//
// It is strict: data must be exactly one JSON object, with no unknown
// field, no repeated key at any depth, no duplicate region and every
// number in range. The Problem it returns passes Validate, with RTTms
// +Inf for every pair not given and the model parameters not given at
// their defaults. Every error matches ErrInvalidInput and names the
// offending field by its JSON path.
func ParseInput(data []byte) (Problem, error) {
	in, err := ParseSlicedInput(data)
	return in.Problem, err
}

// Criticalities names the bands of the input's demand slices, by band:
// reqclass.Criticality's names in its order (critical 0, standard 1,
// sheddable 2; cmd/isobar's tests check they agree). optimize itself only
// knows bands.
func Criticalities() []string { return []string{"critical", "standard", "sheddable"} }

// DefaultBand is the band of a slice that names no criticality
// (standard).
const DefaultBand = 1

// MaxInputSlices bounds a region's "demand" list.
const MaxInputSlices = 64

// SlicedInput is a parsed input with its demand slices.
type SlicedInput struct {
	// Problem is the input's problem; a region's DemandRPS is the sum of
	// its slices.
	Problem Problem
	// Slices are every region's demand in input order: its "demand"
	// entries in order, or one slice of DefaultBand, unconstrained, of
	// its demand_rps (also when that is 0).
	Slices []Slice
	// Sliced reports whether any region gave a "demand" list.
	Sliced bool
}

// ReadSlicedInput is ReadInput for ParseSlicedInput.
func ReadSlicedInput(r io.Reader) (SlicedInput, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return SlicedInput{}, err
	}
	if len(data) > MaxInputBytes {
		return SlicedInput{}, inputError{fmt.Errorf("larger than %d bytes", MaxInputBytes)}
	}
	return ParseSlicedInput(data)
}

// ParseSlicedInput is ParseInput, also returning the demand slices. A
// region entry may give its demand as a list instead of demand_rps:
//
//	"demand": [{"rps": 30, "criticality": "critical", "allowed_regions": ["a"]},
//	           {"rps": 60}]
//
// criticality is one of Criticalities (default standard); without
// allowed_regions the slice may be served anywhere, with it only in the
// regions it names (a non-empty list of the input's regions, each once).
// Giving both demand_rps and demand is an error unless they agree (to
// 1e-9, relative). Errors name the field by its JSON path, as ParseInput's.
func ParseSlicedInput(data []byte) (SlicedInput, error) {
	in, err := parseInput(data)
	if err != nil {
		return SlicedInput{}, inputError{err}
	}
	return in, nil
}

// inputFields lists the top-level input fields.
func inputFields() []string {
	return []string{"headroom", "beta", "k", "shed_penalty_ms", "regions", "rtt_ms"}
}

// regionFields lists a region's input fields.
func regionFields() []string {
	return []string{"name", "demand_rps", "demand", "capacity_rps", "engine_latency_ms", "down"}
}

func parseInput(data []byte) (SlicedInput, error) {
	if err := checkJSONKeys(data); err != nil {
		return SlicedInput{}, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return SlicedInput{}, fmt.Errorf("want a JSON object with %s", strings.Join(inputFields(), ", "))
	}
	for _, k := range sortedKeys(top) {
		if !slices.Contains(inputFields(), k) {
			return SlicedInput{}, fmt.Errorf("unknown field %q (known: %s)", k, strings.Join(inputFields(), ", "))
		}
	}
	p, err := parseModel(top)
	if err != nil {
		return SlicedInput{}, err
	}
	in, parsed, index, err := parseRegions(top, p)
	if err != nil {
		return SlicedInput{}, err
	}
	for i, ri := range parsed {
		if err := in.addSlices(ri, i, index); err != nil {
			return SlicedInput{}, err
		}
	}
	rtt, err := parseRTT(top["rtt_ms"], index)
	if err != nil {
		return SlicedInput{}, err
	}
	in.Problem.RTTms = rtt
	if err := in.Problem.Validate(); err != nil {
		return SlicedInput{}, err // backstop: the checks above should catch everything
	}
	return in, nil
}

// parseModel returns a problem with the input's model parameters (the
// defaults where not given) and no regions.
func parseModel(top map[string]json.RawMessage) (Problem, error) {
	p := Problem{
		Headroom:      DefaultHeadroom,
		Beta:          DefaultBeta,
		K:             DefaultK,
		ShedPenaltyMs: DefaultShedPenaltyMs,
	}
	for _, num := range []struct {
		key    string
		dst    *float64
		lo, hi float64
		want   string
	}{
		{"headroom", &p.Headroom, MinHeadroom, 1, "want 0 < headroom ≤ 1 (at least 0.001)"},
		{"beta", &p.Beta, MinValue, MaxValue, fmt.Sprintf("want %g ≤ beta ≤ %g", MinValue, MaxValue)},
		{"k", &p.K, 1, MaxK, fmt.Sprintf("want 1 ≤ k ≤ %g", MaxK)},
		{"shed_penalty_ms", &p.ShedPenaltyMs, MinValue, MaxValue, fmt.Sprintf("want a penalty in ms, %g to %g", MinValue, MaxValue)},
	} {
		raw, ok := top[num.key]
		if !ok {
			continue
		}
		v, err := jsonNumber(raw, num.key)
		if err != nil {
			return Problem{}, err
		}
		if !(v >= num.lo && v <= num.hi) {
			return Problem{}, fmt.Errorf("%s = %v: %s", num.key, v, num.want)
		}
		*num.dst = v
	}
	return p, nil
}

// parseRegions parses the regions into p and returns the input so far,
// each region's entry and the regions' indexes by name.
func parseRegions(top map[string]json.RawMessage, p Problem) (SlicedInput, []regionInput, map[string]int, error) {
	rawRegions, ok := top["regions"]
	if !ok {
		return SlicedInput{}, nil, nil, errors.New("regions: missing: give at least one region")
	}
	var regions []json.RawMessage
	if err := json.Unmarshal(rawRegions, &regions); err != nil || regions == nil {
		return SlicedInput{}, nil, nil, fmt.Errorf("regions: want an array of regions, got %s", jsonKind(rawRegions))
	}
	if len(regions) == 0 {
		return SlicedInput{}, nil, nil, errors.New("regions: empty: give at least one region")
	}
	if len(regions) > MaxRegions {
		return SlicedInput{}, nil, nil, fmt.Errorf("regions: %d regions, at most %d", len(regions), MaxRegions)
	}
	index := make(map[string]int, len(regions))
	parsed := make([]regionInput, len(regions))
	for i, raw := range regions {
		ri, err := parseRegion(raw, i, p.ShedPenaltyMs)
		if err != nil {
			return SlicedInput{}, nil, nil, err
		}
		if k, dup := index[ri.r.Name]; dup {
			return SlicedInput{}, nil, nil, fmt.Errorf("regions[%d].name %q: duplicate of regions[%d]", i, ri.r.Name, k)
		}
		index[ri.r.Name] = i
		parsed[i] = ri
		p.Regions = append(p.Regions, ri.r)
	}
	return SlicedInput{Problem: p}, parsed, index, nil
}

// regionInput is one parsed region entry.
type regionInput struct {
	r Region
	// demand is the raw "demand" list, nil when not given (then
	// demand_rps is required); hasRPS reports whether demand_rps was given.
	demand json.RawMessage
	hasRPS bool
}

// parseRegion parses regions[i].
func parseRegion(raw json.RawMessage, i int, penalty float64) (regionInput, error) {
	r, demand, hasRPS, err := parseRegionFields(raw, i, penalty)
	return regionInput{r: r, demand: demand, hasRPS: hasRPS}, err
}

func parseRegionFields(raw json.RawMessage, i int, penalty float64) (r Region, demand json.RawMessage, hasRPS bool, err error) {
	at := fmt.Sprintf("regions[%d]", i)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return Region{}, nil, false, fmt.Errorf("%s: want an object with %s, got %s", at, strings.Join(regionFields(), ", "), jsonKind(raw))
	}
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(regionFields(), k) {
			return Region{}, nil, false, fmt.Errorf("%s: unknown field %q (known: %s)", at, k, strings.Join(regionFields(), ", "))
		}
	}
	rawName, ok := fields["name"]
	if !ok {
		return r, nil, false, fmt.Errorf("%s.name: missing", at)
	}
	if err := json.Unmarshal(rawName, &r.Name); err != nil || jsonKind(rawName) != "a string" {
		return r, nil, false, fmt.Errorf("%s.name: want a string, got %s", at, jsonKind(rawName))
	}
	if err := checkRegionName(r.Name); err != nil {
		return r, nil, false, fmt.Errorf("%s.name %q: %w", at, r.Name, err)
	}
	at = fmt.Sprintf("regions[%d] (%q)", i, r.Name)
	for _, num := range []struct {
		key     string
		dst     *float64
		zeroOK  bool
		meaning string
	}{
		{"demand_rps", &r.DemandRPS, true, "requests/s of ingress demand, or give a demand list"},
		{"capacity_rps", &r.CapacityRPS, true, "requests/s served at SLO"},
		{"engine_latency_ms", &r.EngineLatencyMs, false, "engine latency at low load, ms"},
	} {
		rawNum, ok := fields[num.key]
		if !ok && num.key == "demand_rps" && fields["demand"] != nil {
			continue // given by the demand list
		}
		if !ok {
			return r, nil, false, fmt.Errorf("%s.%s: missing (%s)", at, num.key, num.meaning)
		}
		v, err := jsonNumber(rawNum, at+"."+num.key)
		if err != nil {
			return r, nil, false, err
		}
		if !(v >= 0 && v <= MaxValue) || (!num.zeroOK && v == 0) {
			lo := "0"
			if !num.zeroOK {
				lo = "above 0"
			}
			return r, nil, false, fmt.Errorf("%s.%s = %v: want %s to %g (%s)", at, num.key, v, lo, MaxValue, num.meaning)
		}
		*num.dst = v
	}
	if r.EngineLatencyMs >= penalty {
		return r, nil, false, fmt.Errorf("%s.engine_latency_ms = %v: must be below shed_penalty_ms (%v), or shedding beats serving", at, r.EngineLatencyMs, penalty)
	}
	if rawDown, ok := fields["down"]; ok {
		if err := json.Unmarshal(rawDown, &r.Down); err != nil || jsonKind(rawDown) != "a boolean" {
			return r, nil, false, fmt.Errorf("%s.down: want true or false, got %s", at, jsonKind(rawDown))
		}
	}
	_, hasRPS = fields["demand_rps"]
	return r, fields["demand"], hasRPS, nil
}

// checkRegionName refuses names that would garble a text table or logs.
func checkRegionName(name string) error {
	switch {
	case name == "":
		return errors.New("empty: every region needs a name")
	case len(name) > MaxRegionNameBytes:
		return fmt.Errorf("longer than %d bytes", MaxRegionNameBytes)
	case !utf8.ValidString(name):
		return errors.New("not valid UTF-8")
	}
	for _, c := range name {
		if !unicode.IsPrint(c) || unicode.IsSpace(c) {
			return fmt.Errorf("contains %q: use printable characters without spaces", c)
		}
	}
	return nil
}

// parseRTT builds the symmetric RTT matrix: +Inf where no pair is given,
// 0 on the diagonal.
func parseRTT(raw json.RawMessage, index map[string]int) ([][]float64, error) {
	n := len(index)
	rtt := make([][]float64, n)
	given := make([][]bool, n)
	for i := range rtt {
		rtt[i] = make([]float64, n)
		given[i] = make([]bool, n)
		for j := range rtt[i] {
			if i != j {
				rtt[i][j] = math.Inf(1)
			}
		}
	}
	if raw == nil {
		return rtt, nil
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(raw, &outer); err != nil || outer == nil {
		return nil, fmt.Errorf("rtt_ms: want an object of objects, {\"a\": {\"b\": 20}}, got %s", jsonKind(raw))
	}
	for _, a := range sortedKeys(outer) {
		i, ok := index[a]
		if !ok {
			return nil, fmt.Errorf("rtt_ms.%s: unknown region %q", a, a)
		}
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(outer[a], &inner); err != nil || inner == nil {
			return nil, fmt.Errorf("rtt_ms.%s: want an object of RTTs by region, got %s", a, jsonKind(outer[a]))
		}
		for _, b := range sortedKeys(inner) {
			at := fmt.Sprintf("rtt_ms.%s.%s", a, b)
			j, ok := index[b]
			if !ok {
				return nil, fmt.Errorf("%s: unknown region %q", at, b)
			}
			v, err := jsonNumber(inner[b], at)
			if err != nil {
				return nil, err
			}
			switch {
			case i == j && v != 0:
				return nil, fmt.Errorf("%s = %v: the RTT of a region to itself is 0", at, v)
			case !(v >= 0 && v <= MaxValue):
				return nil, fmt.Errorf("%s = %v: want 0 to %g ms (leave a pair out when it is unreachable)", at, v, MaxValue)
			case given[i][j] && rtt[i][j] != v:
				return nil, fmt.Errorf("%s = %v but rtt_ms.%s.%s = %v: RTT is symmetric, give the pair once", at, v, b, a, rtt[i][j])
			}
			rtt[i][j], rtt[j][i] = v, v
			given[i][j], given[j][i] = true, true
		}
	}
	return rtt, nil
}

// jsonNumber decodes one JSON number, naming the field in its errors.
func jsonNumber(raw json.RawMessage, at string) (float64, error) {
	if k := jsonKind(raw); k != "a number" {
		return 0, fmt.Errorf("%s: want a number, got %s", at, k)
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf("%s: %s is out of range", at, bytes.TrimSpace(raw))
	}
	return v, nil
}

// jsonKind names the kind of a raw JSON value, for error messages.
func jsonKind(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	switch t[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// checkJSONKeys checks that data is exactly one JSON value and that no
// object in it repeats a key (encoding/json would keep the last silently).
// Errors name the path of the offending object.
func checkJSONKeys(data []byte) error {
	var kc keyChecker
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // ranges are checked, with the field's name, later
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("not valid JSON: %w", err)
		}
		if len(kc.stack) == 0 && kc.values > 0 {
			return errors.New("not valid JSON: more than one value")
		}
		if isKey, err := kc.key(tok); err != nil {
			return err
		} else if isKey {
			continue
		}
		switch tok {
		case json.Delim('{'):
			kc.stack = append(kc.stack, &keyFrame{obj: true, path: kc.childPath(), keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			kc.stack = append(kc.stack, &keyFrame{path: kc.childPath()})
		case json.Delim('}'), json.Delim(']'):
			kc.stack = kc.stack[:len(kc.stack)-1]
			kc.done()
		default:
			kc.done()
		}
	}
	if kc.values == 0 {
		return errors.New("not valid JSON: empty input")
	}
	return nil
}

// keyChecker is checkJSONKeys' walk: the containers open at the current
// token and the count of complete top-level values.
type keyChecker struct {
	stack  []*keyFrame
	values int
}

// keyFrame is one open object or array.
type keyFrame struct {
	obj     bool
	path    string
	keys    map[string]bool
	wantKey bool   // object: the next token is a key or '}'
	key     string // object: the key of the value being read
	index   int    // array: the index of the value being read
}

// done records that a value ended: its container moves on.
func (kc *keyChecker) done() {
	if len(kc.stack) == 0 {
		kc.values++
		return
	}
	if f := kc.stack[len(kc.stack)-1]; f.obj {
		f.wantKey = true
	} else {
		f.index++
	}
}

// childPath is the path of the value about to start.
func (kc *keyChecker) childPath() string {
	if len(kc.stack) == 0 {
		return ""
	}
	f := kc.stack[len(kc.stack)-1]
	if !f.obj {
		return fmt.Sprintf("%s[%d]", f.path, f.index)
	}
	if f.path == "" {
		return f.key
	}
	return f.path + "." + f.key
}

// key reports whether tok is an object's key, recording it, and fails on
// a key the object already has.
func (kc *keyChecker) key(tok json.Token) (bool, error) {
	if len(kc.stack) == 0 {
		return false, nil
	}
	f := kc.stack[len(kc.stack)-1]
	if !f.obj || !f.wantKey {
		return false, nil
	}
	key, ok := tok.(string)
	if !ok {
		return false, nil
	}
	if f.keys[key] {
		at := f.path
		if at == "" {
			at = "input"
		}
		return false, fmt.Errorf("%s: duplicate key %q", at, key)
	}
	f.keys[key] = true
	f.key, f.wantKey = key, false
	return true, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
