package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/isobar-mesh/isobar"

// TestLayers enforces the dependency rules of HOUSE_STYLE.md: pure packages
// do no I/O, leaves import nothing of ours, roles do not reach into each
// other, and only cmd and lab wire concrete roles together. The xDS contract
// the regional controller and the gateway share is a leaf of its own,
// xdscontract, so no package under gateway depends, even transitively, on
// any package under regional (issue 14); likewise the optimiser both tiers
// use is a leaf, optimize, so regional names no global package.
func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		// The architecture gate must not vanish: a tree go list cannot read
		// is a failure, not a reason to skip.
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %s/...: %v\n%s", module, err, stderr)
	}
	type pkg struct {
		ImportPath string
		Imports    []string
		Deps       []string
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.ImportPath)
	}
	checkTopLevel(t, paths)
	pure := map[string]bool{
		"regional/cycle": true,
		"regional/score": true, "regional/lifecycle": true, "regional/projection": true, "regional/capacity": true,
		"optimize": true, "summary": true, "xdscontract": true, "internal/quantile": true, "internal/truncate": true, "internal/backoff": true,
		"internal/keepwrite": true,
	}
	// pureMay lists what a pure package may import despite ioImports:
	// regional/cycle parses endpoint addresses with net.SplitHostPort, a
	// string function (no dial, no listen: checked by reading it).
	pureMay := map[string][]string{"regional/cycle": {"net"}}
	ioImports := []string{"net", "net/http", "os", "log/slog", "google.golang.org/grpc", "github.com/prometheus/client_golang/prometheus"}
	// forbidden[a] lists packages a must not import (prefix match).
	roles := []string{"/regional", "/global", "/sim", "/cellagent", "/gateway", "/lab"}
	others := func(self string, extra ...string) []string {
		var out []string
		for _, r := range roles {
			if r != self {
				out = append(out, module+r)
			}
		}
		for _, e := range extra {
			out = append(out, module+e)
		}
		return out
	}
	forbidden := map[string][]string{
		"proto/isobarpb": {module + "/"},
		"summary":        {module + "/regional", module + "/global", module + "/election", module + "/sim", module + "/cellagent", module + "/gateway", module + "/lab"},
		"election":       {module + "/"},
		"optimize":       {module + "/"},
		"xdscontract":    {module + "/"},
		"internal":       {module + "/"},
		// Contracts between two sides are leaves, so that neither side
		// imports the other: the admin API (lab serves, chaos calls), the
		// streaming-completion client (bench/load, chaos and lab), the
		// debug API's JSON shapes (regional and global serve, statusview
		// reads).
		"adminapi":   {module + "/"},
		"completion": {module + "/"},
		"debugapi":   {module + "/"},
		// Harness arrows run chaos → lab and bench → lab, never back: the
		// lab reaches chaos only through adminapi and the load driver only
		// through completion; chaos names the gateway's headers through
		// xdscontract, not the gateway.
		"lab":       {module + "/chaos", module + "/bench", module + "/cmd"},
		"chaos":     {module + "/gateway", module + "/bench", module + "/cmd", module + "/regional", module + "/global", module + "/cellagent"},
		"bench":     {module + "/cmd", module + "/chaos"},
		"sim":       others("/sim"),
		"cellagent": others("/cellagent"),
		"regional":  others("/regional"),
		"global":    others("/global"),
		"gateway":   others("/gateway", "/election"),
		// The status client reads the regional and global debug APIs
		// through their contracts, debugapi and the wire protocol, and
		// imports nothing else of ours; it must stay importable by the lab
		// and cmd.
		"statusview": {module + "/"},
	}
	// shared are leaves any package may import, a leaf such as election
	// included: each owns one small mechanism the repository has once
	// (backoff, quantile, truncate), and depends on nothing of ours
	// (forbiddenDeps).
	shared := []string{module + "/internal/backoff", module + "/internal/quantile", module + "/internal/truncate", module + "/internal/grpcbounds", module + "/internal/promreg",
		module + "/internal/keepwrite"}
	// allowed[a] lists packages of ours a may import despite its rules:
	// election loads its etcd client certificate with certs' reloading key
	// pair (one rotation mechanism; certs depends only on truncate).
	allowed := map[string][]string{
		"election":   {module + "/certs", module + "/internal/truncate"},
		"completion": {module + "/xdscontract"},
		// The global's debug API serves the plan in force as the wire
		// protocol's RoutingPlan (protojson): a contract too.
		"statusview": {module + "/debugapi", module + "/proto/isobarpb"},
	}
	// forbiddenDeps[a] lists the trees (a package and every package under
	// it) that a must not depend on, even transitively: go list's Deps, the
	// non-test dependencies.
	forbiddenDeps := map[string][]string{
		"gateway":           {module + "/regional"},
		"xdscontract":       {module},
		"adminapi":          {module},
		"debugapi":          {module},
		"completion":        {module + "/gateway", module + "/regional", module + "/lab", module + "/chaos", module + "/bench"},
		"regional/cycle":    {module + "/regional/xds/internal"},
		"lab":               {module + "/chaos", module + "/bench"},
		"internal/backoff":  {module},
		"internal/quantile": {module},
		"internal/truncate": {module},
		// grpcbounds is the one source of keepalive and stream bounds
		// every gRPC client and server uses: it depends on nothing of ours.
		"internal/grpcbounds": {module},
		// promreg is the one metric-registration idiom (all or an error).
		"internal/promreg": {module},
		// keepwrite is the one write-only-what-changed idiom of the
		// cycle's buffers.
		"internal/keepwrite": {module},
	}
	under := func(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		switch path.Base(rel) {
		case "util", "utils", "common", "helpers", "types", "misc":
			t.Errorf("package %s: meaningless package name", rel)
		}
		for _, imp := range p.Imports {
			if pure[rel] {
				for _, bad := range ioImports {
					if imp == bad && !slices.Contains(pureMay[rel], imp) {
						t.Errorf("pure package %s imports %s", rel, imp)
					}
				}
			}
			for prefix, rules := range forbidden {
				if rel != prefix && !strings.HasPrefix(rel, prefix+"/") {
					continue
				}
				for _, bad := range rules {
					if strings.HasPrefix(imp, bad) && !strings.HasPrefix(imp, module+"/"+rel) && !slices.Contains(shared, imp) && !slices.Contains(allowed[prefix], imp) {
						t.Errorf("%s imports %s", rel, imp)
					}
				}
			}
		}
		for prefix, rules := range forbiddenDeps {
			if rel != prefix && !strings.HasPrefix(rel, prefix+"/") {
				continue
			}
			for _, dep := range p.Deps {
				for _, bad := range rules {
					if under(dep, bad) && !under(dep, module+"/"+rel) {
						t.Errorf("%s depends on %s", rel, dep)
					}
				}
			}
		}
	}
}

// maxCommandCode bounds the code of one file of this package: lines
// outside comments and string literals (the commands' help is long and
// welcome). The largest command file has about 300; the status client and
// the plan input's parser had about 600 each before they moved out.
const maxCommandCode = 400

// TestCommandFilesStaySmall keeps cmd/isobar the shim it should be: flag
// parsing, opening files and printing, each command calling into a
// package. A file that grows past maxCommandCode lines of code holds logic
// that belongs in a package of its own, where it can be tested and reused
// without the command line.
func TestCommandFilesStaySmall(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		lines := func(n ast.Node) int { return fset.Position(n.End()).Line - fset.Position(n.Pos()).Line }
		code := lines(f) + 1
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				code -= lines(lit)
			}
			return true
		})
		for _, c := range f.Comments {
			code -= lines(c) + 1
		}
		if code > maxCommandCode {
			t.Errorf("%s: %d lines of code (at most %d): move the logic into a package and keep the command to flags, files and printing", name, code, maxCommandCode)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no files checked: wrong directory?")
	}
}

// topLevel classifies every top-level directory of the module: the top
// level holds roles, harnesses and contracts (and the binary, the wire
// protocol, deployment files and the judges); a mechanism no outside user
// should import belongs under internal/. A new top-level package must be
// placed in one of these kinds here, deliberately.
var topLevel = map[string]string{
	"cellagent": "role", "regional": "role", "global": "role", "gateway": "role", "sim": "role",
	"lab": "harness", "chaos": "harness", "bench": "harness", "statusview": "harness",
	"xdscontract": "contract", "summary": "contract", "optimize": "contract", "election": "contract",
	"certs": "contract", "adminapi": "contract", "completion": "contract", "debugapi": "contract",
	"reqclass": "contract", "residency": "contract",
	"proto": "wire protocol", "cmd": "binary", "deploy": "deployment", "test": "judges", "internal": "internal",
}

func checkTopLevel(t *testing.T, importPaths []string) {
	t.Helper()
	for _, ip := range importPaths {
		rel := strings.TrimPrefix(strings.TrimPrefix(ip, module), "/")
		top, _, _ := strings.Cut(rel, "/")
		if _, ok := topLevel[top]; !ok {
			t.Errorf("top-level package %s is neither a role, a harness nor a contract: move it under internal/ or classify it in topLevel", top)
		}
	}
}
