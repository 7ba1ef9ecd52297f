package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCodesAreConstants keeps every error code the server and the CLI write
// one of the client package's constants (client.Code...), so that
// client.Codes, and the OpenAPI enum tied to it, are all the codes there
// are: a string literal where a code goes fails here.
func TestCodesAreConstants(t *testing.T) {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, root := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			// Tests may plant codes the server never sends.
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			files = append(files, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(files) < 100 {
		t.Fatalf("read %d files of internal/ and cmd/: the walk went wrong", len(files))
	}
	for _, l := range literalCodes(fset, files) {
		t.Errorf("%s: error code %s is a string literal: use its constant in package client (client/codes.go)", l.pos, l.lit)
	}
}

// TestLiteralCodes is TestCodesAreConstants's finder on planted source.
func TestLiteralCodes(t *testing.T) {
	// Functions that take a code, as the finder learns them from the source
	// (errdefs's, and helpers of any package).
	const decls = `package p
func New(kind Kind, code, format string, args ...any) error { return nil }
func NotFound(code, format string, args ...any) error { return nil }
func refuse(w any, status int, code, msg string) {}
type Kind string
`
	tests := []struct {
		name string
		src  string
		want []string // the literals found
	}{
		{"a constructor's code", `errdefs.New(errdefs.KindConflict, "name_taken", "taken")`, []string{`"name_taken"`}},
		{"a shorthand's code", `errdefs.NotFound("sandbox_not_found", "no %s", x)`, []string{`"sandbox_not_found"`}},
		{"a helper's code", `refuse(w, 401, "unauthenticated", "who are you")`, []string{`"unauthenticated"`}},
		{"a closure's code", `cls := func(kind errdefs.Kind, code, format string) error { return nil }
		cls(errdefs.KindUpstream, "registry_unreachable", "down")`, []string{`"registry_unreachable"`}},
		{"a struct's Code", `_ = &errdefs.Error{Kind: k, Code: "invalid_image", Msg: m}`, []string{`"invalid_image"`}},
		{"a map's code", `_ = map[string]string{"code": "unauthenticated", "message": m}`, []string{`"unauthenticated"`}},
		{"an assigned code", `e.Code = "sandbox_unreachable"`, []string{`"sandbox_unreachable"`}},
		{"a compared code", `if es.Info.Code == "internal" || errdefs.CodeOf(err) != "not_found" {}`, []string{`"internal"`, `"not_found"`}},
		{"a switch on a code", `switch res.Code { case "path_exists", client.CodePathUnsafe: }`, []string{`"path_exists"`}},
		{"a code constant", `const codeTimeout = "registry_timeout"`, []string{`"registry_timeout"`}},
		{"a kind", `const KindNoSpace Kind = "insufficient_storage"`, []string{`"insufficient_storage"`}},

		{"constants are fine", `errdefs.New(errdefs.KindConflict, client.CodeNameTaken, "taken %s", "x")
		_ = &errdefs.Error{Code: files.CodeInvalid}
		refuse(w, 401, client.CodeUnauthenticated, "no")
		const codeTimeout = client.CodeRegistryTimeout`, nil},
		{"messages are not codes", `errdefs.NotFound(code, "sandbox %s not found", "x")`, nil},
		{"no code given", `errdefs.New(errdefs.KindForbidden, "", "no")`, nil},
		{"an exit code", `_ = agent.Exit{Code: 124}; ex.Code = 1`, nil},
		{"other fields and keys", `_ = Event{Type: "error", Status: "done"}; _ = map[string]string{"message": "x"}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fset := token.NewFileSet()
			d, err := parser.ParseFile(fset, "decls.go", decls, 0)
			if err != nil {
				t.Fatal(err)
			}
			src := tt.src
			if !strings.HasPrefix(src, "const") {
				src = "func f() {\n" + src + "\n}"
			}
			f, err := parser.ParseFile(fset, "planted.go", "package p\n"+src, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range literalCodes(fset, []*ast.File{d, f}) {
				got = append(got, l.lit)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("literalCodes(%s) = %q, want %q", tt.src, got, tt.want)
			}
		})
	}
}

type literalCode struct {
	pos token.Position
	lit string
}

// literalCodes finds string literals written where an error code goes: a
// function's parameter named code (errdefs.New, errdefs.NotFound, a
// package's own helper), a Code field or a "code" key of a literal, a
// code assigned, compared or switched on, a constant named code... or of
// type Kind (a kind's name is its default code).
func literalCodes(fset *token.FileSet, files []*ast.File) []literalCode {
	// Pass 1: the functions (and closures) that take a code, by name, and
	// where the code goes among their arguments.
	takes := map[string][]int{}
	codeParams := func(ft *ast.FuncType) []int {
		var at []int
		i := 0
		for _, fld := range ft.Params.List {
			names := max(len(fld.Names), 1)
			for j := range names {
				if len(fld.Names) > 0 && fld.Names[j].Name == "code" {
					at = append(at, i)
				}
				i++
			}
		}
		return at
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if at := codeParams(n.Type); at != nil {
					takes[n.Name.Name] = at
				}
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if fl, ok := rhs.(*ast.FuncLit); ok && i < len(n.Lhs) {
						if id, ok := n.Lhs[i].(*ast.Ident); ok {
							if at := codeParams(fl.Type); at != nil {
								takes[id.Name] = at
							}
						}
					}
				}
			}
			return true
		})
	}

	var found []literalCode
	report := func(e ast.Expr) {
		if l, ok := e.(*ast.BasicLit); ok && l.Kind == token.STRING && l.Value != `""` {
			found = append(found, literalCode{fset.Position(l.Pos()), l.Value})
		}
	}
	// isCode reports whether e holds a code: x.Code, code, CodeOf(err).
	isCode := func(e ast.Expr) bool {
		switch e := e.(type) {
		case *ast.SelectorExpr:
			return e.Sel.Name == "Code"
		case *ast.Ident:
			return e.Name == "code"
		case *ast.CallExpr:
			return funcName(e.Fun) == "CodeOf"
		}
		return false
	}
	isCodeName := func(s string) bool {
		return strings.HasPrefix(s, "Code") || strings.HasPrefix(s, "code")
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				for _, i := range takes[funcName(n.Fun)] {
					if i < len(n.Args) {
						report(n.Args[i])
					}
				}
			case *ast.KeyValueExpr:
				switch k := n.Key.(type) {
				case *ast.Ident:
					if k.Name == "Code" || k.Name == "code" {
						report(n.Value)
					}
				case *ast.BasicLit:
					if k.Value == `"code"` {
						report(n.Value)
					}
				}
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if isCode(lhs) && i < len(n.Rhs) {
						report(n.Rhs[i])
					}
				}
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					if isCode(n.X) {
						report(n.Y)
					}
					if isCode(n.Y) {
						report(n.X)
					}
				}
			case *ast.SwitchStmt:
				if n.Tag != nil && isCode(n.Tag) {
					for _, s := range n.Body.List {
						for _, e := range s.(*ast.CaseClause).List {
							report(e)
						}
					}
				}
			case *ast.ValueSpec:
				kind := false
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "Kind" {
					kind = true
				}
				for i, name := range n.Names {
					if (kind || isCodeName(name.Name)) && i < len(n.Values) {
						report(n.Values[i])
					}
				}
			}
			return true
		})
	}
	return found
}

// funcName is the name a call calls: f of f(), errdefs.New's New.
func funcName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}
