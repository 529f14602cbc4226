package optimize

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// sliceFields lists a demand slice's input fields.
func sliceFields() []string { return []string{"rps", "criticality", "allowed_regions"} }

// addSlices appends region i's slices: its demand list, or one
// unconstrained slice of DefaultBand of its demand_rps. With a list, the
// region's DemandRPS becomes the list's sum (which must agree with
// demand_rps when both are given).
func (in *SlicedInput) addSlices(ri regionInput, i int, index map[string]int) error {
	if ri.demand == nil {
		in.Slices = append(in.Slices, Slice{Source: i, Band: DefaultBand, RPS: ri.r.DemandRPS})
		return nil
	}
	in.Sliced = true
	at := fmt.Sprintf("regions[%d] (%q).demand", i, ri.r.Name)
	var list []json.RawMessage
	if err := json.Unmarshal(ri.demand, &list); err != nil || list == nil {
		return fmt.Errorf("%s: want an array of slices, [{\"rps\": 30, \"criticality\": \"critical\"}], got %s", at, jsonKind(ri.demand))
	}
	if len(list) > MaxInputSlices {
		return fmt.Errorf("%s: %d slices, at most %d", at, len(list), MaxInputSlices)
	}
	var sum float64
	for k, raw := range list {
		s, err := parseSlice(raw, fmt.Sprintf("%s[%d]", at, k), index)
		if err != nil {
			return err
		}
		s.Source = i
		sum += s.RPS
		in.Slices = append(in.Slices, s)
	}
	if sum > MaxValue {
		return fmt.Errorf("%s: the slices add up to %g rps, at most %g", at, sum, MaxValue)
	}
	if d := ri.r.DemandRPS; ri.hasRPS && math.Abs(d-sum) > 1e-9*math.Max(1, d) {
		return fmt.Errorf("regions[%d] (%q).demand_rps = %v but its demand slices add up to %v: give one of them, or make them agree", i, ri.r.Name, d, sum)
	}
	in.Problem.Regions[i].DemandRPS = sum
	return nil
}

// parseSlice parses one demand slice at JSON path at.
func parseSlice(raw json.RawMessage, at string, index map[string]int) (Slice, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return Slice{}, fmt.Errorf("%s: want an object with %s, got %s", at, strings.Join(sliceFields(), ", "), jsonKind(raw))
	}
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(sliceFields(), k) {
			return Slice{}, fmt.Errorf("%s: unknown field %q (known: %s)", at, k, strings.Join(sliceFields(), ", "))
		}
	}
	s := Slice{Band: DefaultBand}
	rawRPS, ok := fields["rps"]
	if !ok {
		return s, fmt.Errorf("%s.rps: missing (requests/s of the slice)", at)
	}
	v, err := jsonNumber(rawRPS, at+".rps")
	if err != nil {
		return s, err
	}
	if !(v >= 0 && v <= MaxValue) {
		return s, fmt.Errorf("%s.rps = %v: want 0 to %g requests/s", at, v, MaxValue)
	}
	s.RPS = v
	if rawC, ok := fields["criticality"]; ok {
		var c string
		if err := json.Unmarshal(rawC, &c); err != nil || jsonKind(rawC) != "a string" {
			return s, fmt.Errorf("%s.criticality: want a string, got %s", at, jsonKind(rawC))
		}
		if s.Band = slices.Index(Criticalities(), c); s.Band < 0 {
			return s, fmt.Errorf("%s.criticality %q: unknown (known: %s)", at, truncName(c), strings.Join(Criticalities(), ", "))
		}
	}
	if rawA, ok := fields["allowed_regions"]; ok {
		if s.Allowed, err = parseAllowed(rawA, at+".allowed_regions", index); err != nil {
			return s, err
		}
	}
	return s, nil
}

// parseAllowed parses a slice's allowed_regions: a non-empty list of the
// input's regions, each once.
func parseAllowed(raw json.RawMessage, at string, index map[string]int) ([]int, error) {
	var names []json.RawMessage
	if err := json.Unmarshal(raw, &names); err != nil || names == nil {
		return nil, fmt.Errorf("%s: want an array of region names, got %s", at, jsonKind(raw))
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: empty: leave allowed_regions out to allow any region", at)
	}
	out := make([]int, 0, len(names))
	for k, rawName := range names {
		var name string
		if err := json.Unmarshal(rawName, &name); err != nil || jsonKind(rawName) != "a string" {
			return nil, fmt.Errorf("%s[%d]: want a region name, got %s", at, k, jsonKind(rawName))
		}
		j, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("%s[%d]: unknown region %q", at, k, truncName(name))
		}
		if slices.Contains(out, j) {
			return nil, fmt.Errorf("%s[%d]: region %q listed twice", at, k, name)
		}
		out = append(out, j)
	}
	return out, nil
}

// truncName bounds outside input quoted in an error.
func truncName(s string) string {
	if len(s) > MaxRegionNameBytes {
		return s[:MaxRegionNameBytes] + "…"
	}
	return s
}
