package work

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"strings"
	"testing"

	engineapi "github.com/worklog/worklog/internal/engine"
)

// engineOptionals is every optional interface (and concrete engine) that package work asks
// an engine for, with whether each backend must provide it. TestEngineAssertionsLookUnderTheWrapper
// finds every such assertion in the package's code and fails on one this table lacks, so
// a new one is checked on every backend here (PostgreSQL's engine asserts its own at compile
// time: var _ engineapi.Watcher, engineapi.Pruner in postgres/).
var engineOptionals = map[string]struct {
	has        func(engine) bool
	mem, store bool // NewInMemory's engine, Open's
}{
	"engineapi.Pruner":  {func(e engine) bool { _, ok := e.(engineapi.Pruner); return ok }, true, true},
	"engineapi.Watcher": {func(e engine) bool { _, ok := e.(engineapi.Watcher); return ok }, false, false},
	"*pebbleEngine":     {func(e engine) bool { _, ok := e.(*pebbleEngine); return ok }, false, true},
}

// The waiters' wrapper (watchedEngine) hides its engine's optional interfaces: an assertion
// on the wrapper answers "not supported" on every backend (Prune did, for a round). Every
// type assertion or type switch in package work's code whose type is an engine's optional
// interface or a concrete engine must look under the wrapper: its operand is a call of
// baseEngine or a selection of a wrapper's engine field. And each such interface must be
// reachable that way on every backend that has it (engineOptionals).
func TestEngineAssertionsLookUnderTheWrapper(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	found := map[string]bool{}
	for _, f := range files {
		var fn string // the function being walked
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				fn = n.Name.Name
			case *ast.TypeAssertExpr:
				types := []ast.Expr{n.Type}
				if n.Type == nil { // a type switch: its cases
					types = switchCases(f, n)
				}
				for _, typ := range types {
					s := exprString(fset, typ)
					if !engineType(s) {
						continue
					}
					if fn == "baseEngine" && s == "*watchedEngine" {
						continue // the unwrapping itself
					}
					found[s] = true
					if !underWrapper(n.X) {
						t.Errorf("%s: %s asserts %s on %s: look under the waiters' wrapper, which hides it (baseEngine(...) or .engine)",
							fset.Position(n.Pos()), fn, s, exprString(fset, n.X))
					}
				}
			}
			return true
		})
	}
	if len(found) == 0 {
		t.Fatal("no assertion of an engine's optional interface found: the scan is broken")
	}
	for s := range found {
		if _, ok := engineOptionals[s]; !ok {
			t.Errorf("package work asserts %s on an engine: add it to engineOptionals, with the backends that must have it", s)
		}
	}

	// Each is reachable under the wrapper of each embedded backend's queue, or absent where
	// the backend lacks it.
	mem := NewInMemory()
	defer mem.Close()
	store, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for s, o := range engineOptionals {
		for _, b := range []struct {
			name string
			q    *Queue
			want bool
		}{{"NewInMemory", mem, o.mem}, {"Open", store, o.store}} {
			if got := o.has(baseEngine(b.q.log.eng)); got != b.want {
				t.Errorf("%s's engine under the waiters' wrapper: %s %v, want %v", b.name, s, got, b.want)
			}
			if o.has(b.q.log.eng) {
				t.Errorf("%s: the wrapper itself has %s: the table's premise (the wrapper hides it) is stale", b.name, s)
			}
		}
	}
}

// engineType reports whether an asserted type (as source text) is an engine's optional
// interface or a concrete engine.
func engineType(s string) bool {
	return strings.HasPrefix(s, "engineapi.") || (strings.HasPrefix(s, "*") && strings.HasSuffix(s, "Engine"))
}

// underWrapper reports whether x looks under the waiters' wrapper: baseEngine(...) or
// something.engine.
func underWrapper(x ast.Expr) bool {
	switch x := ast.Unparen(x).(type) {
	case *ast.CallExpr:
		id, ok := x.Fun.(*ast.Ident)
		return ok && id.Name == "baseEngine"
	case *ast.SelectorExpr:
		return x.Sel.Name == "engine"
	}
	return false
}

// switchCases returns the types of the cases of the type switch whose guard is a.
func switchCases(f *ast.File, a *ast.TypeAssertExpr) []ast.Expr {
	var out []ast.Expr
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSwitchStmt)
		if !ok {
			return true
		}
		var guard ast.Expr
		switch s := ts.Assign.(type) {
		case *ast.AssignStmt:
			guard = s.Rhs[0]
		case *ast.ExprStmt:
			guard = s.X
		}
		if guard != a {
			return true
		}
		for _, c := range ts.Body.List {
			out = append(out, c.(*ast.CaseClause).List...)
		}
		return false
	})
	return out
}

func exprString(fset *token.FileSet, x ast.Expr) string {
	var b strings.Builder
	if err := printer.Fprint(&b, fset, x); err != nil {
		return "?"
	}
	return b.String()
}
