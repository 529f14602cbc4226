package gateway

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
)

// Command-line forms of the request-class settings (`isobar gateway` and
// `isobar picker`), parsed here so they are tested and fuzzed with the
// rest of the package.

// maxObjectiveName bounds an objective name in ParseObjectivePriority.
const maxObjectiveName = 253

// ParseObjectivePriority reads "name=N,name=N" (--objective-priority):
// Inference Extension objective names and their integer priorities. ""
// is none. A name repeated, empty, longer than 253 bytes or with
// whitespace, or a priority that is not an integer, is an error.
func ParseObjectivePriority(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, f := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return nil, fmt.Errorf("objective priority %q: want name=N", f)
		}
		if name == "" || len(name) > maxObjectiveName || strings.ContainsAny(name, " \t\r\n") {
			return nil, fmt.Errorf("objective name %q: want 1 to %d bytes without whitespace", name, maxObjectiveName)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("objective %q given twice", name)
		}
		p, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || p < -1<<31 || p > 1<<31-1 {
			return nil, fmt.Errorf("objective %q: priority %q is not a 32-bit integer", name, v)
		}
		out[name] = p
	}
	if len(out) > 1024 {
		return nil, fmt.Errorf("%d objectives, at most 1024", len(out))
	}
	return out, nil
}

// parsePerClass reads "critical=V,standard=V,sheddable=V" (any subset,
// each once) into vals with parse.
func parsePerClass[T any](s string, vals *[reqclass.Count]T, parse func(string) (T, error)) error {
	seen := [reqclass.Count]bool{}
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		name, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		c, known := reqclass.Parse(name)
		if !ok || !known || strings.TrimSpace(name) == "" {
			return fmt.Errorf("%q: want critical=V, standard=V or sheddable=V", f)
		}
		if seen[c] {
			return fmt.Errorf("%s given twice", c)
		}
		seen[c] = true
		x, err := parse(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		vals[c] = x
	}
	return nil
}

// ParseQueueLengths reads --queue-length ("critical=128,standard=256,...")
// into lengths, leaving the classes it does not name as they are.
func ParseQueueLengths(s string, lengths *[reqclass.Count]int) error {
	return parsePerClass(s, lengths, func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("length %q is not an integer >= 0", v)
		}
		return n, nil
	})
}

// ParseQueueAges reads --queue-max-age ("critical=10s,...") into ages,
// leaving the classes it does not name as they are.
func ParseQueueAges(s string, ages *[reqclass.Count]time.Duration) error {
	return parsePerClass(s, ages, func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("max age %q is not a positive duration", v)
		}
		return d, nil
	})
}

// ParseQueueClasses reads a list of criticalities ("standard,sheddable",
// --queue-newest-first and --queue-objective) into set: "" leaves set as
// it is, "none" clears it, otherwise exactly the classes named, each once,
// are set.
func ParseQueueClasses(s string, set *[reqclass.Count]bool) error {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	var out [reqclass.Count]bool
	if s != "none" {
		for _, f := range strings.Split(s, ",") {
			c, ok := reqclass.Parse(strings.TrimSpace(f))
			if !ok || strings.TrimSpace(f) == "" {
				return fmt.Errorf("%q: want a list of critical, standard, sheddable, or none", f)
			}
			if out[c] {
				return fmt.Errorf("%s given twice", c)
			}
			out[c] = true
		}
	}
	*set = out
	return nil
}
