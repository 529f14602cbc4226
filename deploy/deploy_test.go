package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"sigs.k8s.io/yaml"
)

// deployFS is the deploy/ directory (the test's working directory).
func deployFS() fs.FS { return os.DirFS(".") }

// TestEveryFileParses: each YAML document converts to JSON, each JSON file
// is valid, each unit and environment file parses.
func TestEveryFileParses(t *testing.T) {
	seen := map[string]int{}
	err := fs.WalkDir(deployFS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(deployFS(), p)
		if err != nil {
			return err
		}
		ext := filepath.Ext(p)
		seen[ext]++
		switch ext {
		case ".yaml", ".yml":
			docs := splitYAML(data)
			if len(docs) == 0 {
				t.Errorf("%s: no YAML document", p)
			}
			for i, doc := range docs {
				if _, err := toJSON(doc); err != nil {
					t.Errorf("%s document %d: %v", p, i+1, err)
				}
			}
		case ".json":
			if !json.Valid(data) {
				t.Errorf("%s: invalid JSON", p)
			}
		case ".service":
			u, err := parseUnit(data)
			if err != nil {
				t.Errorf("%s: %v", p, err)
				return nil
			}
			for _, s := range []string{"Unit", "Service", "Install"} {
				if u[s] == nil {
					t.Errorf("%s: no [%s] section", p, s)
				}
			}
			if len(u["Service"]["ExecStart"]) != 1 {
				t.Errorf("%s: want one ExecStart", p)
			}
		case ".env":
			if _, err := parseEnvFile(data); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{".yaml", ".yml", ".json", ".service", ".env"} {
		t.Logf("%d %s files", seen[ext], ext)
	}
	if seen[".yaml"]+seen[".yml"] < 8 || seen[".json"] < 1 || seen[".service"] < 4 {
		t.Errorf("too few files found: %v", seen)
	}
}

func TestSplitYAML(t *testing.T) {
	docs := splitYAML([]byte("# only a comment\n---\na: 1\n--- \nb: |\n  x\n  ---not a separator\n---\n\n"))
	if len(docs) != 2 || !strings.Contains(string(docs[1]), "---not a separator") {
		t.Fatalf("docs = %q", docs)
	}
}

// ---- Kubernetes ----

var namespaced = map[string]bool{
	"ConfigMap": true, "Secret": true, "Service": true, "Deployment": true, "StatefulSet": true,
	"DaemonSet": true, "PodDisruptionBudget": true, "ServiceAccount": true, "Job": true, "Pod": true,
}

func TestKubernetesManifests(t *testing.T) {
	ms, err := readManifests(deployFS())
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	configMaps := map[string]map[string]any{}
	for _, m := range ms {
		at := fmt.Sprintf("%s document %d", m.File, m.Index+1)
		kind := m.kind()
		kinds[kind]++
		if av, _ := m.Obj["apiVersion"].(string); av == "" {
			t.Errorf("%s: no apiVersion", at)
		}
		if kind == "" {
			t.Errorf("%s: no kind", at)
			continue
		}
		if kind == "Kustomization" {
			continue
		}
		if m.name() == "" {
			t.Errorf("%s: %s without metadata.name", at, kind)
		}
		md, _ := m.Obj["metadata"].(map[string]any)
		if namespaced[kind] && md["namespace"] != "isobar" {
			t.Errorf("%s: %s/%s not in namespace isobar", at, kind, m.name())
		}
		switch kind {
		case "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount":
			t.Errorf("%s: %s: isobar needs no Kubernetes API access", at, kind)
		case "ConfigMap":
			data, _ := m.Obj["data"].(map[string]any)
			configMaps[m.name()] = data
		}
		if ps := podSpec(m); ps != nil {
			if ps["automountServiceAccountToken"] != false {
				t.Errorf("%s: %s/%s mounts a service account token; isobar does not use the API", at, kind, m.name())
			}
			if len(containers(ps)) == 0 {
				t.Errorf("%s: %s/%s has no containers", at, kind, m.name())
			}
		}
	}
	for _, k := range []string{"Namespace", "ConfigMap", "Deployment", "StatefulSet", "DaemonSet", "Service", "PodDisruptionBudget"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in the manifests", k)
		}
	}

	// References: ConfigMaps and their keys exist; Services select pods
	// that expose their named target ports.
	for _, m := range ms {
		ps := podSpec(m)
		if ps == nil {
			continue
		}
		vols, _ := ps["volumes"].([]any)
		for _, v := range vols {
			vm, _ := v.(map[string]any)
			if cm, ok := vm["configMap"].(map[string]any); ok {
				if _, ok := configMaps[fmt.Sprint(cm["name"])]; !ok {
					t.Errorf("%s %s: volume uses undefined ConfigMap %v", m.File, m.name(), cm["name"])
				}
			}
		}
		for _, c := range containers(ps) {
			if _, err := containerEnv(c, m.name(), configMaps); err != nil {
				t.Errorf("%s %s container %v: %v", m.File, m.name(), c["name"], err)
			}
		}
	}
	for _, m := range ms {
		if m.kind() != "Service" {
			continue
		}
		spec, _ := m.Obj["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		if len(sel) == 0 {
			t.Errorf("%s: Service %s selects nothing", m.File, m.name())
			continue
		}
		var portNames []string
		matched := false
		for _, w := range ms {
			if podSpec(w) == nil || podLabels(w) == nil || !selects(sel, podLabels(w)) {
				continue
			}
			matched = true
			for _, c := range containers(podSpec(w)) {
				ports, _ := c["ports"].([]any)
				for _, p := range ports {
					pm, _ := p.(map[string]any)
					if n, ok := pm["name"].(string); ok {
						portNames = append(portNames, n)
					}
				}
			}
		}
		if !matched {
			t.Errorf("%s: Service %s selects no workload in the manifests", m.File, m.name())
			continue
		}
		ports, _ := spec["ports"].([]any)
		for _, p := range ports {
			pm, _ := p.(map[string]any)
			if tp, ok := pm["targetPort"].(string); ok && !slices.Contains(portNames, tp) {
				t.Errorf("%s: Service %s targets port %q, which its pods do not name (%v)", m.File, m.name(), tp, portNames)
			}
		}
	}

	// The bootstrap ConfigMap carries deploy/envoy/bootstrap.yaml verbatim.
	want, err := fs.ReadFile(deployFS(), "envoy/bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, ok := configMaps["isobar-envoy-bootstrap"]["bootstrap.yaml"].(string)
	if !ok || got != string(want) {
		t.Errorf("ConfigMap isobar-envoy-bootstrap differs from envoy/bootstrap.yaml; regenerate it")
	}
}

func podLabels(m manifest) map[string]any {
	if m.kind() == "Pod" {
		md, _ := m.Obj["metadata"].(map[string]any)
		l, _ := md["labels"].(map[string]any)
		return l
	}
	spec, _ := m.Obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	md, _ := tmpl["metadata"].(map[string]any)
	l, _ := md["labels"].(map[string]any)
	return l
}

func selects(sel, labels map[string]any) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKustomizationListsFiles(t *testing.T) {
	data, err := fs.ReadFile(deployFS(), "kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := fs.Glob(deployFS(), "kubernetes/*.yaml")
	for _, f := range files {
		base := filepath.Base(f)
		listed := slices.Contains(k.Resources, base)
		// The DaemonSet cellagent is the alternative to cell-sidecar.yaml.
		if !listed && base != "kustomization.yaml" && base != "cellagent-daemonset.yaml" {
			t.Errorf("%s is not in kustomization.yaml", base)
		}
	}
	for _, r := range k.Resources {
		if _, err := fs.Stat(deployFS(), "kubernetes/"+r); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		}
	}
}

// ---- isobar command lines ----

// flagKind is what value a flag takes: a string, none (a boolean flag), a
// time.Duration or a number.
type flagKind int

const (
	str flagKind = iota
	boolean
	duration
	number
)

var globalFlags = map[string]flagKind{"log-level": str, "log-format": str}

// cliFlags are the flags of the subcommands the deployment files run, as
// `isobar <cmd> --help` prints them (cmd/isobar's certs_test.go also
// parses every invocation with the real command tree), with the kind of
// value each takes.
var cliFlags = map[string]map[string]flagKind{
	"regional": {
		"admin-token-file": str, "cell-capacity-rps": number, "cycle-interval": duration, "etcd-ca": str,
		"etcd-cert": str, "etcd-endpoints": str, "etcd-key": str, "forget-after": duration, "gossip-join": str,
		"gossip-key-file": str, "gossip-listen": str, "heartbeat-interval": duration, "metrics-listen": str,
		"ingress-address": str, "lb-policy": str, "listen": str, "max-heartbeat-bytes": number,
		"endpoint-binding": str, "endpoint-map-file": str, "state-dir": str,
		"probe-interval": duration, "region": str, "score-weights": str, "summary-interval": duration,
		"tls-ca": str, "tls-cert": str, "tls-key": str, "ttl-grace": duration, "zone": str,
	},
	"cellagent": {
		"advertise": str, "cell-id": str, "completion-handlers": str, "controller": str, "dcgm-gpu": str,
		"dcgm-url": str, "interval": duration, "max-body-bytes": number, "metrics-listen": str, "nvml": boolean,
		"once": boolean, "output": str, "region": str, "scrape-interval": duration, "scrape-timeout": duration,
		"shutdown-timeout": duration, "startup-grace": duration, "tls-ca": str, "tls-cert": str, "tls-key": str,
		"tls-server-name": str, "vllm-url": str, "window": duration,
	},
	"global": {
		"advertise": str, "cycle-interval": duration, "damp-step": number, "election-prefix": str, "etcd-ca": str,
		"etcd-cert": str, "etcd-endpoints": str, "etcd-key": str, "gossip-join": str, "gossip-key-file": str,
		"gossip-listen": str, "headroom": number, "metrics-listen": str, "lease-ttl": duration, "listen": str,
		"name": str, "plan-key": str, "plan-ttl": duration, "region-ttl": duration, "regions": str,
		"tls-ca": str, "tls-cert": str, "tls-key": str,
	},
	// isobar gateway (gateway.Config): --controller, --region, --lb, --listen,
	// --metrics-listen and the --tls-* flags every gRPC client takes.
	"gateway": {
		"controller": str, "region": str, "lb": str, "listen": str, "metrics-listen": str,
		"tls-ca": str, "tls-cert": str, "tls-key": str,
	},
}

// required are the flags each long-running subcommand cannot run without,
// plus mTLS, which every deployment file turns on.
var required = map[string][]string{
	"regional":  {"region", "tls-cert", "tls-key", "tls-ca"},
	"cellagent": {"cell-id", "region", "controller", "vllm-url", "tls-cert", "tls-key", "tls-ca"},
	"global":    {"etcd-endpoints", "tls-cert", "tls-key", "tls-ca"},
	"gateway":   {"controller", "region", "tls-cert", "tls-key", "tls-ca"},
}

// parseInvocation checks one command line against cliFlags and returns the
// flags given.
func parseInvocation(args []string) (string, map[string]string, error) {
	if len(args) == 0 {
		return "", nil, errors.New("no subcommand")
	}
	sub := args[0]
	known, ok := cliFlags[sub]
	if !ok {
		return sub, nil, fmt.Errorf("unknown subcommand %q", sub)
	}
	got := map[string]string{}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			return sub, nil, fmt.Errorf("stray argument %q", a)
		}
		name, val, hasVal := strings.Cut(a[2:], "=")
		kind, ok := known[name]
		if !ok {
			kind, ok = globalFlags[name]
		}
		if !ok {
			return sub, nil, fmt.Errorf("unknown flag --%s", name)
		}
		if kind == boolean {
			if hasVal && val != "true" && val != "false" {
				return sub, nil, fmt.Errorf("--%s=%q: want true or false", name, val)
			}
		} else if !hasVal {
			if i+1 >= len(args) {
				return sub, nil, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		if _, dup := got[name]; dup {
			return sub, nil, fmt.Errorf("--%s given twice", name)
		}
		if kind == duration {
			if _, err := time.ParseDuration(val); err != nil {
				return sub, nil, fmt.Errorf("--%s=%q: %v", name, val, err)
			}
		}
		got[name] = val
	}
	for _, r := range required[sub] {
		if got[r] == "" {
			return sub, nil, fmt.Errorf("--%s is missing", r)
		}
	}
	return sub, got, nil
}

func TestParseInvocationRefuses(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"regional", "--region=r", "--tls-cert=c", "--tls-key=k", "--tls-ca=a", "--bogus=1"},
		{"regional", "--tls-cert=c", "--tls-key=k", "--tls-ca=a"},
		{"regional", "--region=r", "--tls-cert=c", "--tls-key=k", "--tls-ca=a", "--forget-after=soon"},
		{"regional", "--region=r", "--region=s", "--tls-cert=c", "--tls-key=k", "--tls-ca=a"},
		{"cellagent", "stray"},
		{"global", "--listen"},
	} {
		if _, _, err := parseInvocation(args); err == nil {
			t.Errorf("parseInvocation(%q) accepted", args)
		}
	}
}

func TestInvocationsUseRealFlags(t *testing.T) {
	invs, err := Invocations(deployFS())
	if err != nil {
		t.Fatal(err)
	}
	subs := map[string]int{}
	for _, inv := range invs {
		sub, flags, err := parseInvocation(inv.Args)
		if err != nil {
			t.Errorf("%s %s: %v\n  %q", inv.File, inv.Where, err, inv.Args)
			continue
		}
		subs[sub]++
		if flags["log-format"] != "json" {
			t.Errorf("%s %s: want --log-format=json for collectors", inv.File, inv.Where)
		}
	}
	// Kubernetes: regional, cellagent (sidecar and DaemonSet), global;
	// systemd: all four.
	for sub, want := range map[string]int{"regional": 2, "cellagent": 3, "global": 2, "gateway": 1} {
		if subs[sub] != want {
			t.Errorf("%d invocations of %s, want %d", subs[sub], sub, want)
		}
	}
}

func TestInvocationsRefuseUnresolvedPlaceholders(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"k8s": {"kubernetes/x.yaml": &fstest.MapFile{Data: []byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: x, namespace: isobar}
spec:
  template:
    spec:
      containers:
      - name: c
        image: isobar:dev
        args: [regional, --region=$(NOPE)]
`)}},
		"systemd": {
			"systemd/x.service": &fstest.MapFile{Data: []byte("[Service]\nEnvironmentFile=/etc/isobar/x.env\nExecStart=/usr/local/bin/isobar regional --region=${NOPE}\n")},
			"systemd/x.env":     &fstest.MapFile{Data: []byte("OTHER=1\n")},
		},
	} {
		if _, err := Invocations(fsys); !errors.Is(err, ErrPlaceholder) {
			t.Errorf("%s: err = %v, want ErrPlaceholder", name, err)
		}
	}
}

// ---- metric names ----

// goSources returns every "isobar_..." string literal and every
// lower-case string literal in the repository's non-test Go sources.
func goSources(t *testing.T) (metrics, literals map[string]bool) {
	t.Helper()
	metrics, literals = map[string]bool{}, map[string]bool{}
	lit := regexp.MustCompile(`"([a-z0-9_]+)"`)
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "deploy", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			literals[m[1]] = true
			if strings.HasPrefix(m[1], "isobar_") {
				metrics[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(metrics) < 30 {
		t.Fatalf("found only %d isobar_ metric names in the Go sources", len(metrics))
	}
	return metrics, literals
}

var metricRef = regexp.MustCompile(`\bisobar_[a-z0-9_]+`)

// unknownMetrics returns the isobar_ names in expr that the code does not
// export (a histogram's _bucket/_sum/_count series count as its name).
func unknownMetrics(expr string, known map[string]bool) []string {
	var bad []string
	for _, name := range metricRef.FindAllString(expr, -1) {
		if known[name] {
			continue
		}
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if !known[base] {
			bad = append(bad, name)
		}
	}
	return bad
}

var matcher = regexp.MustCompile(`\b(reason|state|source|result|type|code)\s*(=~|=|!=|!~)\s*"([^"]*)"`)

// unknownLabelValues returns label values in expr's matchers (for the
// labels isobar sets itself) that appear nowhere in the Go sources as a
// string literal. A heuristic: it catches typos and invented values, not a
// real word used under the wrong label.
func unknownLabelValues(expr string, literals map[string]bool) []string {
	var bad []string
	for _, m := range matcher.FindAllStringSubmatch(expr, -1) {
		for _, v := range strings.Split(m[3], "|") {
			if v != "" && !literals[v] {
				bad = append(bad, m[1]+"="+v)
			}
		}
	}
	return bad
}

func balanced(expr string) bool {
	depth := 0
	for _, r := range expr {
		switch r {
		case '(', '{', '[':
			depth++
		case ')', '}', ']':
			depth--
			if depth < 0 {
				return false
			}
		}
	}
	return depth == 0
}

func TestMetricCheckersCatchMistakes(t *testing.T) {
	known := map[string]bool{"isobar_a_seconds": true, "isobar_b_total": true}
	if bad := unknownMetrics(`rate(isobar_a_seconds_bucket[5m]) + isobar_b_total`, known); len(bad) != 0 {
		t.Errorf("false alarm: %v", bad)
	}
	if bad := unknownMetrics(`isobar_a_second + isobar_c_total`, known); len(bad) != 2 {
		t.Errorf("missed typos: %v", bad)
	}
	lits := map[string]bool{"plan": true, "failed": true}
	if bad := unknownLabelValues(`x{source!="plan",state=~"failed|gone"}`, lits); !slices.Equal(bad, []string{"state=gone"}) {
		t.Errorf("label values: %v", bad)
	}
	if balanced(`sum(rate(x[5m])`) || !balanced(`sum(rate(x{a="b"}[5m]))`) {
		t.Error("balanced")
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func TestAlertRules(t *testing.T) {
	known, literals := goSources(t)
	data, err := fs.ReadFile(deployFS(), "prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	var all strings.Builder
	alertName := regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`)
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: want a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			if !alertName.MatchString(r.Alert) || names[r.Alert] {
				t.Errorf("alert %q: want a unique CamelCase name", r.Alert)
			}
			names[r.Alert] = true
			if r.Expr == "" || !balanced(r.Expr) {
				t.Errorf("%s: expression %q is empty or unbalanced", r.Alert, r.Expr)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q: want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want summary and description annotations", r.Alert)
			}
			if bad := unknownMetrics(r.Expr, known); len(bad) > 0 {
				t.Errorf("%s: metrics not exported by the code: %v", r.Alert, bad)
			}
			if bad := unknownLabelValues(r.Expr, literals); len(bad) > 0 {
				t.Errorf("%s: label values the code never sets: %v", r.Alert, bad)
			}
			all.WriteString(r.Expr + "\n")
		}
	}
	// The conditions operators must hear about.
	for _, m := range []string{
		"isobar_regional_cell_heartbeat_staleness_seconds", "isobar_global_leader", "isobar_regional_plan_epoch",
		"isobar_global_plan_sequence", "isobar_regional_cell_fallback", "isobar_regional_xds_nacks_total",
		"isobar_global_summaries_rejected_total", "isobar_regional_route_source",
	} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("no alert on %s", m)
		}
	}
}

func TestPrometheusConfigs(t *testing.T) {
	for _, f := range []string{"prometheus/prometheus.yml", "prometheus/prometheus-kubernetes.yml"} {
		data, err := fs.ReadFile(deployFS(), f)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			RuleFiles     []string `json:"rule_files"`
			ScrapeConfigs []struct {
				JobName     string `json:"job_name"`
				MetricsPath string `json:"metrics_path"`
				FileSD      []any  `json:"file_sd_configs"`
				KubeSD      []any  `json:"kubernetes_sd_configs"`
			} `json:"scrape_configs"`
		}
		if err := yaml.Unmarshal(data, &cfg); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, r := range cfg.RuleFiles {
			if _, err := fs.Stat(deployFS(), "prometheus/"+r); err != nil {
				t.Errorf("%s: rule file %s: %v", f, r, err)
			}
		}
		jobs := map[string]bool{}
		for _, sc := range cfg.ScrapeConfigs {
			if jobs[sc.JobName] {
				t.Errorf("%s: job %s twice", f, sc.JobName)
			}
			jobs[sc.JobName] = true
			if len(sc.FileSD)+len(sc.KubeSD) == 0 {
				t.Errorf("%s: job %s discovers no targets", f, sc.JobName)
			}
		}
		for _, j := range []string{"isobar-regional", "isobar-global", "isobar-cellagent", "envoy", "vllm", "dcgm-exporter"} {
			if !jobs[j] {
				t.Errorf("%s: no %s job", f, j)
			}
		}
	}
}

// ---- Grafana ----

func TestGrafanaDashboard(t *testing.T) {
	known, literals := goSources(t)
	data, err := fs.ReadFile(deployFS(), "grafana/isobar.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	sort.Strings(vars)
	if !slices.Equal(vars, []string{"datasource", "region"}) {
		t.Errorf("template variables = %v", vars)
	}
	ids := map[int]bool{}
	var all strings.Builder
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" || !balanced(tg.Expr) || tg.RefID == "" {
				t.Errorf("panel %q: bad target %+v", p.Title, tg)
			}
			if bad := unknownMetrics(tg.Expr, known); len(bad) > 0 {
				t.Errorf("panel %q: metrics not exported by the code: %v", p.Title, bad)
			}
			if bad := unknownLabelValues(tg.Expr, literals); len(bad) > 0 {
				t.Errorf("panel %q: label values the code never sets: %v", p.Title, bad)
			}
			all.WriteString(tg.Expr + "\n")
		}
	}
	for _, m := range []string{
		"isobar_regional_cells", "isobar_regional_cell_pressure", "isobar_regional_cell_weight",
		"isobar_regional_plan_epoch", "isobar_regional_route_source", "isobar_gateway_requests_total",
		"isobar_gateway_ttft_seconds_bucket", "isobar_regional_failover_seconds_bucket",
	} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("dashboard does not show %s", m)
		}
	}
}
