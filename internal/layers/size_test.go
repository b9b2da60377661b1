package layers

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The size budget for non-test Go (docs/architecture.md, "The layers"): a
// reader holds a function or a file whole. Lua scripts are .lua files and
// not counted: one operation stays one script.
const (
	maxFuncLines = 100 // from the func keyword to its closing brace
	maxFileLines = 800
)

// sizeExceptions name what may stay over the budget, and why. A key is a
// file's path from the module root ("internal/x/y.go") for the file, or the
// path, a colon and the function's name ("internal/x/y.go:(*T).run") for a
// function. An exception that nothing needs any more is reported too, so
// the table says what is true.
var sizeExceptions = map[string]string{}

// overBudget is one function or file over the budget.
type overBudget struct {
	key   string // as in sizeExceptions
	lines int
	limit int
}

func (o overBudget) String() string {
	return fmt.Sprintf("%s is %d lines, over the budget of %d: split it, or name it with its reason in sizeExceptions (size_test.go)", o.key, o.lines, o.limit)
}

// measureFile returns what in one Go file (path as it is to be reported)
// is over the budget; a generated file is never over.
func measureFile(path string, src []byte) ([]overBudget, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	if ast.IsGenerated(f) {
		return nil, nil
	}
	var over []overBudget
	lines := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		lines++
	}
	if lines > maxFileLines {
		over = append(over, overBudget{key: path, lines: lines, limit: maxFileLines})
	}
	span := func(from, to token.Pos) int {
		return fset.Position(to).Line - fset.Position(from).Line + 1
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch fn := n.(type) {
		case *ast.FuncDecl:
			if fn.Body == nil {
				return false
			}
			// Type.Pos is the func keyword; the doc comment is not counted.
			if l := span(fn.Type.Pos(), fn.Body.Rbrace); l > maxFuncLines {
				over = append(over, overBudget{key: path + ":" + funcName(fn), lines: l, limit: maxFuncLines})
			}
			// A literal inside counts as part of its function.
			return false
		case *ast.FuncLit:
			// Only at package level (a var's value): the others are inside
			// a FuncDecl.
			if l := span(fn.Type.Pos(), fn.Body.Rbrace); l > maxFuncLines {
				key := fmt.Sprintf("%s:func literal at line %d", path, fset.Position(fn.Pos()).Line)
				over = append(over, overBudget{key: key, lines: l, limit: maxFuncLines})
			}
			return false
		}
		return true
	})
	return over, nil
}

// funcName is a function's name as Go writes a method expression:
// "run", "T.run" or "(*T).run".
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	recv := fn.Recv.List[0].Type
	star := false
	if s, ok := recv.(*ast.StarExpr); ok {
		star, recv = true, s.X
	}
	// Drop type parameters: T[K] is T.
	switch r := recv.(type) {
	case *ast.IndexExpr:
		recv = r.X
	case *ast.IndexListExpr:
		recv = r.X
	}
	name := "?"
	if id, ok := recv.(*ast.Ident); ok {
		name = id.Name
	}
	if star {
		return "(*" + name + ")." + fn.Name.Name
	}
	return name + "." + fn.Name.Name
}

// moduleGoFiles returns the module's non-test Go files, as paths from root
// with slashes, skipping testdata and the folders the go tool ignores.
func moduleGoFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// budgetViolations returns one line per function or file over the budget
// that exceptions do not name, and per exception that names nothing over.
func budgetViolations(over []overBudget, exceptions map[string]string) []string {
	var bad []string
	used := map[string]bool{}
	for _, o := range over {
		if _, ok := exceptions[o.key]; ok {
			used[o.key] = true
			continue
		}
		bad = append(bad, o.String())
	}
	for key := range exceptions {
		if !used[key] {
			bad = append(bad, "sizeExceptions names "+key+", which is within the budget (or gone): remove the exception")
		}
	}
	slices.Sort(bad)
	return bad
}

// TestSizeBudget: no non-test function of the module is over 100 lines and
// no non-test file over 800, but for the exceptions named with a reason.
func TestSizeBudget(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root is not two folders up: %v", err)
	}
	files, err := moduleGoFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("found %d non-test Go files; the module has more", len(files))
	}
	var over []overBudget
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		o, err := measureFile(f, src)
		if err != nil {
			t.Fatal(err)
		}
		over = append(over, o...)
	}
	for _, v := range budgetViolations(over, sizeExceptions) {
		t.Error(v)
	}
}

// TestSizeBudgetCounts: the count is the one the budget states (a function
// of exactly 100 lines passes, 101 fails, methods are named as Go names
// them, generated files and doc comments do not count), and an exception
// silences exactly what it names.
func TestSizeBudgetCounts(t *testing.T) {
	// body returns a function of n lines, func keyword to closing brace.
	body := func(decl string, n int) string {
		return decl + " {\n" + strings.Repeat("\t_ = 0\n", n-2) + "}\n"
	}
	doc := strings.Repeat("// doc\n", 20)
	src := "package p\n\ntype T[K any] struct{}\n\n" +
		doc + body("func fits()", 100) + "\n" +
		doc + body("func tooLong()", 101) + "\n" +
		body("func (t *T[K]) method()", 101) + "\n" +
		"var f = " + body("func()", 101)
	over, err := measureFile("p/p.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range over {
		got = append(got, fmt.Sprintf("%s %d", o.key, o.lines))
	}
	want := []string{"p/p.go:tooLong 101", "p/p.go:(*T).method 101", "p/p.go:func literal at line 350 101"}
	if !slices.Equal(got, want) {
		t.Errorf("over budget = %q, want %q", got, want)
	}

	long := "package p\n" + strings.Repeat("\n", maxFileLines)
	if over, _ := measureFile("p/long.go", []byte(long)); len(over) != 1 || over[0].key != "p/long.go" || over[0].lines != maxFileLines+1 {
		t.Errorf("a file of %d lines: over budget = %v", maxFileLines+1, over)
	}
	generated := "// Code generated by hand. DO NOT EDIT.\n\n" + long
	if over, _ := measureFile("p/gen.go", []byte(generated)); len(over) != 0 {
		t.Errorf("a generated file is counted: %v", over)
	}

	bad := budgetViolations(over, map[string]string{
		"p/p.go:tooLong": "a reason",
		"p/p.go:gone":    "a reason",
	})
	if len(bad) != 3 || !strings.HasPrefix(bad[0], "p/p.go:(*T).method is 101 lines") ||
		!strings.HasPrefix(bad[1], "p/p.go:func literal") || !strings.HasPrefix(bad[2], "sizeExceptions names p/p.go:gone") {
		t.Errorf("violations = %q", bad)
	}
}
