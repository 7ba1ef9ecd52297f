package client

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// TestCodes keeps Codes the list of codes.go's constants: every constant of
// the server's codes in it once, the client's own codes not.
func TestCodes(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "codes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var server, own []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, n := range vs.Names {
				v, err := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				if n.Name == "CodeServerUnreachable" || n.Name == "CodeStreamEnded" {
					own = append(own, v)
				} else {
					server = append(server, v)
				}
			}
		}
	}
	slices.Sort(server)
	if !slices.Equal(Codes, server) {
		t.Errorf("Codes = %v,\nwant the constants of codes.go: %v", Codes, server)
	}
	if len(slices.Compact(slices.Clone(Codes))) != len(Codes) {
		t.Errorf("Codes has a code twice: %v", Codes)
	}
	snake := regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)
	for _, c := range Codes {
		if !snake.MatchString(c) {
			t.Errorf("code %q is not lower_snake_case", c)
		}
		if !IsCode(c) {
			t.Errorf("IsCode(%q) = false", c)
		}
	}
	for _, c := range append(own, "", "http_502", "nope") {
		if IsCode(c) {
			t.Errorf("IsCode(%q) = true, want false: the server never sends it", c)
		}
	}
}
