package events_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exported returns the exported package-level names declared in the
// non-test files of dir.
func exported(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	add := func(id *ast.Ident) {
		if id.IsExported() {
			names[id.Name] = true
		}
	}
	for _, fi := range files {
		if !strings.HasSuffix(fi.Name(), ".go") || strings.HasSuffix(fi.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, fi.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(d.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						add(s.Name)
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(n)
						}
					}
				}
			}
		}
	}
	return names
}

// TestFacadeIsComplete: every exported name of contract and streamclient
// is re-exported by events under the same name, and events declares
// nothing else, so a program that imports events sees the whole API.
func TestFacadeIsComplete(t *testing.T) {
	facade := exported(t, ".")
	want := map[string]string{}
	for _, dir := range []string{"../contract", "../streamclient"} {
		for n := range exported(t, dir) {
			if other, dup := want[n]; dup {
				t.Errorf("%s is declared in %s and %s", n, other, dir)
			}
			want[n] = dir
		}
	}
	for n, dir := range want {
		if !facade[n] {
			t.Errorf("%s (%s) is not re-exported by events", n, dir)
		}
	}
	for n := range facade {
		if want[n] == "" {
			t.Errorf("events declares %s, which neither contract nor streamclient does", n)
		}
	}
	if len(want) < 150 {
		t.Fatalf("found %d exported names in contract and streamclient; the parse missed declarations", len(want))
	}
}
