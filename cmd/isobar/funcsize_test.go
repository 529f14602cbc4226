package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function or method may be, counted from
// its func keyword to its closing brace.
const maxFuncLines = 80

// kernelExemptions lists the numeric kernels allowed past maxFuncLines:
// dense arithmetic loops whose state lives in a dozen locals, where a split
// would pass that state through parameters and read worse. Keys are
// "path/from/root.go:Recv.Name" (or ":Name" for a function). Keep each
// entry's reason to one line, and keep the list short: orchestration,
// wiring and flag parsing are never kernels.
var kernelExemptions = map[string]string{
	"optimize/solve.go:solver.enter":             "network-simplex pivot: cycle θ and reduced cost along one tree path",
	"optimize/settle.go:solver.targetsNewton":    "safeguarded Newton iteration on one tree's marginal latency, warm-started per destination",
	"optimize/settle.go:solver.targetsBracketed": "bracketed bisection fallback of the same root-find",
}

type funcSize struct {
	name  string // path:Recv.Name
	lines int
}

// moduleFuncs parses every non-test, non-generated Go file under root and
// returns the size of every function and method that has a body.
func moduleFuncs(t *testing.T, root string) (funcs []funcSize, files int) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (name == "node_modules" || name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.HasSuffix(p, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			funcs = append(funcs, funcSize{name: filepath.ToSlash(rel) + ":" + funcName(fd), lines: n})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	sort.SliceStable(funcs, func(i, j int) bool {
		if funcs[i].lines != funcs[j].lines {
			return funcs[i].lines > funcs[j].lines
		}
		return funcs[i].name < funcs[j].name
	})
	return funcs, files
}

// funcName is Name for a function and Recv.Name for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// TestFunctionsStaySmall keeps every function of the module within
// maxFuncLines, numeric kernels in kernelExemptions excepted. It runs in
// full with or without -short (parsing the tree takes well under a second).
// With -v it logs the ten largest functions, exempt or not, so that a
// refactor can report its top ten before and after.
func TestFunctionsStaySmall(t *testing.T) {
	funcs, files := moduleFuncs(t, filepath.Join("..", ".."))
	if files == 0 || len(funcs) == 0 {
		t.Fatalf("checked %d files and %d functions: the walk found nothing, so the gate would pass vacuously", files, len(funcs))
	}
	var top strings.Builder
	for i, f := range funcs[:min(10, len(funcs))] {
		mark := ""
		if _, ok := kernelExemptions[f.name]; ok {
			mark = " (kernel)"
		}
		fmt.Fprintf(&top, "\n%2d. %4d %s%s", i+1, f.lines, f.name, mark)
	}
	t.Logf("checked %d functions in %d files; the ten largest:%s", len(funcs), files, top.String())

	seen := map[string]bool{}
	var over []string
	for _, f := range funcs {
		seen[f.name] = true
		if f.lines <= maxFuncLines {
			continue
		}
		if _, ok := kernelExemptions[f.name]; ok {
			continue
		}
		over = append(over, fmt.Sprintf("%4d %s", f.lines, f.name))
	}
	if len(over) > 0 {
		t.Errorf("%d functions exceed %d lines (split them, or list a true numeric kernel in kernelExemptions), largest first:\n%s",
			len(over), maxFuncLines, strings.Join(over, "\n"))
	}
	for name := range kernelExemptions {
		if !seen[name] {
			t.Errorf("kernelExemptions names %s, which no longer exists: drop the entry", name)
		}
	}
}
