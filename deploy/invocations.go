package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// ErrPlaceholder: a command line names a variable that nothing defines.
var ErrPlaceholder = errors.New("deploy: unresolved placeholder")

// Invocation is one isobar command line in a deployment file.
type Invocation struct {
	// File is the path under deploy/, e.g. "kubernetes/regional.yaml".
	File string
	// Where names what runs it, e.g. "Deployment/isobar-regional
	// container regional" or "ExecStart".
	Where string
	// Args are the arguments after the binary (subcommand first), with
	// placeholders replaced by example values.
	Args []string
}

// TemplateInstance is the instance name used for systemd template units
// (name@.service) when expanding %i.
const TemplateInstance = "gpu0"

// Invocations returns every isobar command line in fsys (rooted at
// deploy/): containers whose image is named isobar in the Kubernetes
// manifests under kubernetes/, and ExecStart lines running .../isobar in
// the units under systemd/. Kubernetes $(VAR) references are resolved from
// the container's env (literal values, ConfigMap keys defined in the
// manifests, and example values for downward-API fields); systemd ${VAR}
// references from the example environment files beside the units
// (/etc/isobar/X.env is systemd/X.env). An unresolved placeholder wraps
// ErrPlaceholder.
func Invocations(fsys fs.FS) ([]Invocation, error) {
	k8s, err := kubernetesInvocations(fsys)
	if err != nil {
		return nil, err
	}
	sd, err := systemdInvocations(fsys)
	if err != nil {
		return nil, err
	}
	return append(k8s, sd...), nil
}

// manifest is one YAML document of a Kubernetes manifest file.
type manifest struct {
	File  string
	Index int
	Obj   map[string]any
}

func (m manifest) kind() string { s, _ := m.Obj["kind"].(string); return s }

func (m manifest) name() string {
	md, _ := m.Obj["metadata"].(map[string]any)
	s, _ := md["name"].(string)
	return s
}

// splitYAML splits a multi-document YAML stream on "---" lines and drops
// documents holding only comments or whitespace.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if hasContent(cur.Bytes()) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

func hasContent(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return true
		}
	}
	return false
}

// readManifests parses every .yaml file under kubernetes/.
func readManifests(fsys fs.FS) ([]manifest, error) {
	files, err := fs.Glob(fsys, "kubernetes/*.yaml")
	if err != nil {
		return nil, err
	}
	var out []manifest
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitYAML(data) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return nil, fmt.Errorf("deploy: %s document %d: %w", f, i+1, err)
			}
			out = append(out, manifest{File: f, Index: i, Obj: obj})
		}
	}
	return out, nil
}

// podSpec returns the pod spec of a workload manifest, or nil.
func podSpec(m manifest) map[string]any {
	spec, _ := m.Obj["spec"].(map[string]any)
	switch m.kind() {
	case "Pod":
		return spec
	case "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job":
		tmpl, _ := spec["template"].(map[string]any)
		ps, _ := tmpl["spec"].(map[string]any)
		return ps
	}
	return nil
}

// containers returns the pod spec's containers and init containers.
func containers(ps map[string]any) []map[string]any {
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := ps[key].([]any)
		for _, c := range list {
			if cm, ok := c.(map[string]any); ok {
				out = append(out, cm)
			}
		}
	}
	return out
}

// isIsobarImage reports whether an image reference names the isobar image
// (any registry, any tag).
func isIsobarImage(image string) bool {
	name := image
	if i := strings.LastIndex(name, "@"); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return path.Base(name) == "isobar"
}

func stringList(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

// fieldExamples are the example values of downward-API fields; %s is the
// workload name.
var fieldExamples = map[string]string{
	"metadata.name":      "%s-0",
	"metadata.namespace": "isobar",
	"spec.nodeName":      "gpu-node-0",
	"status.podIP":       "10.0.0.10",
	"status.hostIP":      "10.0.0.1",
}

var k8sVar = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func kubernetesInvocations(fsys fs.FS) ([]Invocation, error) {
	ms, err := readManifests(fsys)
	if err != nil {
		return nil, err
	}
	configMaps := map[string]map[string]any{}
	for _, m := range ms {
		if m.kind() == "ConfigMap" {
			data, _ := m.Obj["data"].(map[string]any)
			configMaps[m.name()] = data
		}
	}
	var out []Invocation
	for _, m := range ms {
		ps := podSpec(m)
		if ps == nil {
			continue
		}
		for _, c := range containers(ps) {
			image, _ := c["image"].(string)
			if !isIsobarImage(image) {
				continue
			}
			cname, _ := c["name"].(string)
			where := fmt.Sprintf("%s/%s container %s", m.kind(), m.name(), cname)
			env, err := containerEnv(c, m.name(), configMaps)
			if err != nil {
				return nil, fmt.Errorf("deploy: %s %s: %w", m.File, where, err)
			}
			cmd, args := stringList(c["command"]), stringList(c["args"])
			if len(cmd) > 0 {
				args = append(cmd[1:], args...)
			}
			for i, a := range args {
				var missing []string
				args[i] = k8sVar.ReplaceAllStringFunc(a, func(ref string) string {
					name := k8sVar.FindStringSubmatch(ref)[1]
					v, ok := env[name]
					if !ok {
						missing = append(missing, name)
					}
					return v
				})
				if len(missing) > 0 {
					return nil, fmt.Errorf("%w: %s %s: $(%s) in %q is not in the container's env", ErrPlaceholder, m.File, where, missing[0], a)
				}
			}
			out = append(out, Invocation{File: m.File, Where: where, Args: args})
		}
	}
	return out, nil
}

// containerEnv resolves a container's env entries to example values.
func containerEnv(c map[string]any, workload string, configMaps map[string]map[string]any) (map[string]string, error) {
	env := map[string]string{}
	list, _ := c["env"].([]any)
	for _, e := range list {
		em, _ := e.(map[string]any)
		name, _ := em["name"].(string)
		if v, ok := em["value"]; ok {
			env[name] = fmt.Sprint(v)
			continue
		}
		from, _ := em["valueFrom"].(map[string]any)
		switch {
		case from["configMapKeyRef"] != nil:
			ref, _ := from["configMapKeyRef"].(map[string]any)
			cm, key := fmt.Sprint(ref["name"]), fmt.Sprint(ref["key"])
			data, ok := configMaps[cm]
			if !ok {
				return nil, fmt.Errorf("env %s: ConfigMap %q is not defined in the manifests", name, cm)
			}
			v, ok := data[key]
			if !ok {
				return nil, fmt.Errorf("env %s: ConfigMap %q has no key %q", name, cm, key)
			}
			env[name] = fmt.Sprint(v)
		case from["fieldRef"] != nil:
			ref, _ := from["fieldRef"].(map[string]any)
			fp := fmt.Sprint(ref["fieldPath"])
			ex, ok := fieldExamples[fp]
			if !ok {
				return nil, fmt.Errorf("env %s: no example value for field %q", name, fp)
			}
			if strings.Contains(ex, "%s") {
				ex = fmt.Sprintf(ex, workload)
			}
			env[name] = ex
		default:
			return nil, fmt.Errorf("env %s: unsupported valueFrom", name)
		}
	}
	return env, nil
}

// unit is a parsed systemd unit file: section -> key -> values in order.
type unit map[string]map[string][]string

// parseUnit reads a systemd unit: sections, Key=Value lines, comments and
// backslash line continuations.
func parseUnit(data []byte) (unit, error) {
	u := unit{}
	section := ""
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			return nil, fmt.Errorf("line %d: %q is not Key=Value inside a section", n+1, line)
		}
		u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return u, nil
}

// parseEnvFile reads KEY=VALUE lines (comments, blank lines and simple
// quotes allowed), as systemd's EnvironmentFile does.
func parseEnvFile(data []byte) (map[string]string, error) {
	env := map[string]string{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("line %d: %q is not KEY=VALUE", n+1, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	return env, nil
}

var sdVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

func systemdInvocations(fsys fs.FS) ([]Invocation, error) {
	files, err := fs.Glob(fsys, "systemd/*.service")
	if err != nil {
		return nil, err
	}
	var out []Invocation
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		u, err := parseUnit(data)
		if err != nil {
			return nil, fmt.Errorf("deploy: %s: %w", f, err)
		}
		spec := func(s string) string {
			s = strings.ReplaceAll(s, "%i", TemplateInstance)
			return strings.ReplaceAll(s, "%%", "%")
		}
		env := map[string]string{}
		for _, ef := range u["Service"]["EnvironmentFile"] {
			p := spec(strings.TrimPrefix(ef, "-"))
			local := "systemd/" + path.Base(p)
			b, err := fs.ReadFile(fsys, local)
			if err != nil {
				return nil, fmt.Errorf("deploy: %s: EnvironmentFile %s has no example %s: %w", f, p, local, err)
			}
			vars, err := parseEnvFile(b)
			if err != nil {
				return nil, fmt.Errorf("deploy: %s: %w", local, err)
			}
			for k, v := range vars {
				env[k] = v
			}
		}
		for _, exec := range u["Service"]["ExecStart"] {
			words := strings.Fields(spec(exec))
			if len(words) == 0 {
				continue
			}
			bin := strings.TrimLeft(words[0], "-@+!:")
			if path.Base(bin) != "isobar" {
				continue
			}
			args := words[1:]
			for i, a := range args {
				var missing []string
				args[i] = sdVar.ReplaceAllStringFunc(a, func(ref string) string {
					name := sdVar.FindStringSubmatch(ref)[1]
					v, ok := env[name]
					if !ok {
						missing = append(missing, name)
					}
					return v
				})
				if len(missing) > 0 {
					return nil, fmt.Errorf("%w: %s: ${%s} in %q is not in its environment files", ErrPlaceholder, f, missing[0], a)
				}
			}
			out = append(out, Invocation{File: f, Where: "ExecStart", Args: slices.Clip(args)})
		}
	}
	return out, nil
}

// toJSON converts one YAML document to JSON.
func toJSON(doc []byte) ([]byte, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, err
	}
	if !json.Valid(j) {
		return nil, errors.New("deploy: YAML did not convert to valid JSON")
	}
	return j, nil
}
