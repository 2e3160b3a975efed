// Package api computes the exported API of Go packages as the Go project's own api/ files
// record it (one line per exported name and signature: "pkg work, func Open(string,
// *Options) (*Queue, error)"), compares it with the recorded files, and finds exported
// declarations that take or return a type of an internal/ package.
//
// The type-checked packages come from the compiler's export data (go list -export), read with
// go/importer; the lines are written by a port of the walker of the Go distribution's
// cmd/api (src/cmd/api/main_test.go, Copyright 2011 The Go Authors, BSD-style license),
// without its build contexts and deprecation marks.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Package is the exported API of one package.
type Package struct {
	Path     string   // import path
	Name     string   // the path relative to its module's root ("work", "contrib/otelworklog")
	Features []string // sorted lines, each "pkg NAME, ..."
	// Leaks are the exported declarations whose API names a type of an internal/ package, one
	// per declaration and type: "func NewEngineQueue: internal/engine.Engine".
	Leaks []string
}

// Root is the core module's path: a package's Name is its path without it.
const Root = "github.com/worklog/worklog"

// BuildFlags are given to go list: a test built with -race sets "-race", so that the export
// data comes from the packages its own build compiled (in the build cache) instead of a
// second, non-race compile of all of them.
var BuildFlags []string

// Load type-checks the packages patterns names, from the module in dir, and computes their
// API.
func Load(dir string, patterns ...string) ([]Package, error) {
	mod := Root
	args := append([]string{"list", "-e", "-export", "-deps", "-json=ImportPath,Name,Export,DepOnly,Error"}, BuildFlags...)
	args = append(args, patterns...)
	out, err := goOut(dir, args...)
	if err != nil {
		return nil, err
	}
	type listed struct {
		ImportPath, Name, Export string
		DepOnly                  bool
		Error                    *struct{ Err string }
	}
	exports := map[string]string{}
	var targets []listed
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("api: go list output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("api: %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && p.Name != "main" {
			targets = append(targets, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("api: no export data for %s", path)
		}
		return os.Open(f)
	})
	var pkgs []Package
	for _, t := range targets {
		tp, err := imp.Import(t.ImportPath)
		if err != nil {
			return nil, fmt.Errorf("api: %s: %w", t.ImportPath, err)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(t.ImportPath, mod), "/")
		if name == "" {
			name = tp.Name()
		}
		w := &walker{pkg: tp, mod: mod, features: map[string]bool{}, leaks: map[string]bool{}}
		w.export(name)
		pkgs = append(pkgs, Package{Path: t.ImportPath, Name: name, Features: sortedKeys(w.features), Leaks: sortedKeys(w.leaks)})
	}
	slices.SortFunc(pkgs, func(a, b Package) int { return strings.Compare(a.Name, b.Name) })
	return pkgs, nil
}

func goOut(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("api: go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

func sortedKeys(m map[string]bool) []string {
	l := make([]string, 0, len(m))
	for k := range m {
		l = append(l, k)
	}
	slices.Sort(l)
	return l
}

// Public is the API of every public package of the module in dir: every package of ./...
// that is neither a command nor under an internal/ directory.
func Public(dir string) ([]Package, error) {
	pkgs, err := Load(dir, "./...")
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pkgs, func(p Package) bool { return isInternal(p.Path) }), nil
}

// Leaks lists the leaks of every package, each line prefixed with the package's name.
func Leaks(pkgs []Package) []string {
	var l []string
	for _, p := range pkgs {
		for _, k := range p.Leaks {
			l = append(l, p.Name+", "+k)
		}
	}
	return l
}

// FileName is the api/ file of the package named name: its path with "/" as "-", ".txt".
func FileName(name string) string {
	return strings.ReplaceAll(name, "/", "-") + ".txt"
}

// Text is the content of a package's api/ file: its features, one a line.
func (p Package) Text() string {
	if len(p.Features) == 0 {
		return ""
	}
	return strings.Join(p.Features, "\n") + "\n"
}

// Write writes each package's file into dir.
func Write(dir string, pkgs []Package) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range pkgs {
		if len(p.Features) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, FileName(p.Name)), []byte(p.Text()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Diff compares each package's API with its file in dir and describes every difference: the
// lines the code has and the file lacks ("+"), and the lines the file has and the code lacks
// ("-"), per file. "" means none.
func Diff(dir string, pkgs []Package) (string, error) {
	var b strings.Builder
	for _, p := range pkgs {
		file := "api/" + FileName(p.Name)
		data, err := os.ReadFile(filepath.Join(dir, FileName(p.Name)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		if err != nil { // no file: right only for a package that exports nothing
			if len(p.Features) > 0 {
				fmt.Fprintf(&b, "%s: missing (package %s exports %d features)\n", file, p.Path, len(p.Features))
			}
			continue
		}
		var recorded []string
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				recorded = append(recorded, l)
			}
		}
		added, removed := compare(recorded, p.Features)
		if len(added) == 0 && len(removed) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s:\n", file)
		for _, l := range added {
			fmt.Fprintf(&b, "+%s\n", l)
		}
		for _, l := range removed {
			fmt.Fprintf(&b, "-%s\n", l)
		}
	}
	return b.String(), nil
}

// compare returns the lines of got that want lacks and the lines of want that got lacks.
func compare(want, got []string) (added, removed []string) {
	w := map[string]bool{}
	for _, l := range want {
		w[l] = true
	}
	g := map[string]bool{}
	for _, l := range got {
		g[l] = true
		if !w[l] {
			added = append(added, l)
		}
	}
	for _, l := range want {
		if !g[l] {
			removed = append(removed, l)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	return added, removed
}

// walker writes the features of one package (cmd/api's Walker, trimmed).
type walker struct {
	pkg      *types.Package
	mod      string
	scope    []string
	decl     string // the exported declaration being written, for Leaks
	features map[string]bool
	leaks    map[string]bool
}

func (w *walker) export(name string) {
	w.scope = []string{"pkg " + name}
	scope := w.pkg.Scope()
	for _, n := range scope.Names() {
		if token.IsExported(n) {
			w.emitObj(scope.Lookup(n))
		}
	}
}

func (w *walker) pushScope(name string) func() {
	w.scope = append(w.scope, name)
	return func() { w.scope = w.scope[:len(w.scope)-1] }
}

func (w *walker) emitf(format string, args ...any) {
	f := strings.Join(w.scope, ", ") + ", " + fmt.Sprintf(format, args...)
	if strings.Contains(f, "\n") {
		panic("api: feature contains a newline: " + f)
	}
	w.features[f] = true
}

// isInternal reports whether path has an "internal" element.
func isInternal(path string) bool {
	for _, e := range strings.Split(path, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

func (w *walker) noteLeak(pkg *types.Package, name string) {
	if pkg == nil || !isInternal(pkg.Path()) {
		return
	}
	p := strings.TrimPrefix(strings.TrimPrefix(pkg.Path(), w.mod), "/")
	w.leaks[fmt.Sprintf("%s: %s.%s", w.decl, p, name)] = true
}

func sortedMethodNames(typ *types.Interface) []string {
	list := make([]string, typ.NumMethods())
	for i := range list {
		list[i] = typ.Method(i).Name()
	}
	slices.Sort(list)
	return list
}

func (w *walker) sortedEmbeddeds(typ *types.Interface) []string {
	var list []string
	for i := 0; i < typ.NumEmbeddeds(); i++ {
		switch emb := typ.EmbeddedType(i).(type) {
		case *types.Interface:
			list = append(list, w.sortedEmbeddeds(emb)...)
		case *types.Union:
			var buf bytes.Buffer
			for j := 0; j < emb.Len(); j++ {
				if j > 0 {
					buf.WriteString(" | ")
				}
				term := emb.Term(j)
				if term.Tilde() {
					buf.WriteByte('~')
				}
				w.writeType(&buf, term.Type())
			}
			list = append(list, buf.String())
		}
	}
	slices.Sort(list)
	return list
}

func (w *walker) writeType(buf *bytes.Buffer, typ types.Type) {
	switch typ := typ.(type) {
	case *types.Basic:
		s := typ.Name()
		switch typ.Kind() {
		case types.UnsafePointer:
			s = "unsafe.Pointer"
		case types.UntypedBool:
			s = "ideal-bool"
		case types.UntypedInt:
			s = "ideal-int"
		case types.UntypedRune:
			s = "ideal-char"
		case types.UntypedFloat:
			s = "ideal-float"
		case types.UntypedComplex:
			s = "ideal-complex"
		case types.UntypedString:
			s = "ideal-string"
		default:
			switch s {
			case "byte":
				s = "uint8"
			case "rune":
				s = "int32"
			}
		}
		buf.WriteString(s)
	case *types.Array:
		fmt.Fprintf(buf, "[%d]", typ.Len())
		w.writeType(buf, typ.Elem())
	case *types.Slice:
		buf.WriteString("[]")
		w.writeType(buf, typ.Elem())
	case *types.Struct:
		buf.WriteString("struct")
		for i := 0; i < typ.NumFields(); i++ { // an anonymous struct's fields are part of the API too
			if f := typ.Field(i); f.Exported() {
				w.typeString(f.Type())
			}
		}
	case *types.Pointer:
		buf.WriteByte('*')
		w.writeType(buf, typ.Elem())
	case *types.Signature:
		buf.WriteString("func")
		w.writeSignature(buf, typ)
	case *types.Interface:
		buf.WriteString("interface{")
		if typ.NumMethods() > 0 || typ.NumEmbeddeds() > 0 {
			buf.WriteByte(' ')
		}
		if typ.NumMethods() > 0 {
			buf.WriteString(strings.Join(sortedMethodNames(typ), ", "))
			for i := 0; i < typ.NumMethods(); i++ {
				w.signatureString(typ.Method(i).Signature())
			}
		}
		if typ.NumEmbeddeds() > 0 {
			buf.WriteString(strings.Join(w.sortedEmbeddeds(typ), ", "))
		}
		if typ.NumMethods() > 0 || typ.NumEmbeddeds() > 0 {
			buf.WriteByte(' ')
		}
		buf.WriteString("}")
	case *types.Map:
		buf.WriteString("map[")
		w.writeType(buf, typ.Key())
		buf.WriteByte(']')
		w.writeType(buf, typ.Elem())
	case *types.Chan:
		switch typ.Dir() {
		case types.SendOnly:
			buf.WriteString("chan<- ")
		case types.RecvOnly:
			buf.WriteString("<-chan ")
		default:
			buf.WriteString("chan ")
		}
		w.writeType(buf, typ.Elem())
	case *types.Alias:
		w.noteLeak(typ.Obj().Pkg(), typ.Obj().Name())
		w.writeType(buf, types.Unalias(typ))
	case *types.Named:
		obj := typ.Obj()
		pkg := obj.Pkg()
		w.noteLeak(pkg, obj.Name())
		if pkg != nil && pkg != w.pkg {
			buf.WriteString(pkg.Name())
			buf.WriteByte('.')
		}
		buf.WriteString(obj.Name())
		if targs := typ.TypeArgs(); targs.Len() > 0 {
			buf.WriteByte('[')
			for i := 0; i < targs.Len(); i++ {
				if i > 0 {
					buf.WriteString(", ")
				}
				w.writeType(buf, targs.At(i))
			}
			buf.WriteByte(']')
		}
	case *types.TypeParam:
		fmt.Fprintf(buf, "$%d", typ.Index())
	default:
		panic(fmt.Sprintf("api: unknown type %T", typ))
	}
}

func (w *walker) writeSignature(buf *bytes.Buffer, sig *types.Signature) {
	if tparams := sig.TypeParams(); tparams != nil {
		w.writeTypeParams(buf, tparams, true)
	}
	w.writeParams(buf, sig.Params(), sig.Variadic())
	switch res := sig.Results(); res.Len() {
	case 0:
	case 1:
		buf.WriteByte(' ')
		w.writeType(buf, res.At(0).Type())
	default:
		buf.WriteByte(' ')
		w.writeParams(buf, res, false)
	}
}

func (w *walker) writeTypeParams(buf *bytes.Buffer, tparams *types.TypeParamList, withConstraints bool) {
	buf.WriteByte('[')
	for i := 0; i < tparams.Len(); i++ {
		if i > 0 {
			buf.WriteString(", ")
		}
		tp := tparams.At(i)
		w.writeType(buf, tp)
		if withConstraints {
			buf.WriteByte(' ')
			w.writeType(buf, tp.Constraint())
		}
	}
	buf.WriteByte(']')
}

func (w *walker) writeParams(buf *bytes.Buffer, t *types.Tuple, variadic bool) {
	buf.WriteByte('(')
	for i, n := 0, t.Len(); i < n; i++ {
		if i > 0 {
			buf.WriteString(", ")
		}
		typ := t.At(i).Type()
		if variadic && i+1 == n {
			buf.WriteString("...")
			typ = typ.(*types.Slice).Elem()
		}
		w.writeType(buf, typ)
	}
	buf.WriteByte(')')
}

func (w *walker) typeString(typ types.Type) string {
	var buf bytes.Buffer
	w.writeType(&buf, typ)
	return buf.String()
}

func (w *walker) signatureString(sig *types.Signature) string {
	var buf bytes.Buffer
	w.writeSignature(&buf, sig)
	return buf.String()
}

func (w *walker) emitObj(obj types.Object) {
	w.decl = strings.ToLower(fmt.Sprintf("%T", obj)[len("*types."):]) + " " + obj.Name()
	switch obj := obj.(type) {
	case *types.Const:
		w.emitf("const %s %s", obj.Name(), w.typeString(obj.Type()))
		x := obj.Val()
		if short, exact := x.String(), x.ExactString(); short == exact {
			w.emitf("const %s = %s", obj.Name(), short)
		} else {
			w.emitf("const %s = %s  // %s", obj.Name(), short, exact)
		}
	case *types.Var:
		w.emitf("var %s %s", obj.Name(), w.typeString(obj.Type()))
	case *types.TypeName:
		w.decl = "type " + obj.Name()
		w.emitType(obj)
	case *types.Func:
		w.emitf("func %s%s", obj.Name(), w.signatureString(obj.Signature()))
	default:
		panic("api: unknown object: " + obj.String())
	}
}

func (w *walker) emitType(obj *types.TypeName) {
	name := obj.Name()
	typ := obj.Type()
	if obj.IsAlias() {
		w.emitf("type %s = %s", name, w.typeString(typ))
		return
	}
	if tparams := typ.(*types.Named).TypeParams(); tparams != nil {
		var buf bytes.Buffer
		buf.WriteString(name)
		w.writeTypeParams(&buf, tparams, true)
		name = buf.String()
	}
	switch u := typ.Underlying().(type) {
	case *types.Struct:
		w.emitStructType(name, u)
	case *types.Interface:
		w.emitIfaceType(name, u)
		return // its methods are its features
	default:
		w.emitf("type %s %s", name, w.typeString(u))
	}
	seen := map[string]bool{}
	vset := types.NewMethodSet(typ)
	for i := 0; i < vset.Len(); i++ {
		if m := vset.At(i); m.Obj().Exported() {
			w.emitMethod(m)
			seen[m.Obj().Name()] = true
		}
	}
	pset := types.NewMethodSet(types.NewPointer(typ))
	for i := 0; i < pset.Len(); i++ {
		if m := pset.At(i); m.Obj().Exported() && !seen[m.Obj().Name()] {
			w.emitMethod(m)
		}
	}
}

func (w *walker) emitStructType(name string, typ *types.Struct) {
	typeStruct := fmt.Sprintf("type %s struct", name)
	w.emitf("%s", typeStruct)
	defer w.pushScope(typeStruct)()
	for i := 0; i < typ.NumFields(); i++ {
		f := typ.Field(i)
		if !f.Exported() {
			continue
		}
		if f.Anonymous() {
			w.emitf("embedded %s", w.typeString(f.Type()))
			continue
		}
		w.emitf("%s %s", f.Name(), w.typeString(f.Type()))
	}
}

func (w *walker) emitIfaceType(name string, typ *types.Interface) {
	pop := w.pushScope("type " + name + " interface")
	var names []string
	complete := true
	mset := types.NewMethodSet(typ)
	for i := 0; i < mset.Len(); i++ {
		m := mset.At(i).Obj().(*types.Func)
		if !m.Exported() {
			complete = false
			continue
		}
		names = append(names, m.Name())
		w.emitf("%s%s", m.Name(), w.signatureString(m.Signature()))
	}
	if !complete {
		w.emitf("unexported methods")
	}
	pop()
	if !complete {
		return
	}
	if len(names) == 0 {
		w.emitf("type %s interface {}", name)
		return
	}
	slices.Sort(names)
	w.emitf("type %s interface { %s }", name, strings.Join(names, ", "))
}

func (w *walker) emitMethod(m *types.Selection) {
	sig := m.Type().(*types.Signature)
	recv := sig.Recv().Type()
	tps := ""
	if rtp := sig.RecvTypeParams(); rtp != nil {
		var buf bytes.Buffer
		w.writeTypeParams(&buf, rtp, false)
		tps = buf.String()
	}
	w.emitf("method (%s%s) %s%s", w.typeString(recv), tps, m.Obj().Name(), w.signatureString(sig))
}
