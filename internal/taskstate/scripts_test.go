package taskstate

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// TestLuaFilesHeaded: every script file opens with a comment that gives
// its KEYS and ARGV (or names the file whose layout it shares).
func TestLuaFilesHeaded(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(names) == 0 {
		t.Fatalf("no embedded scripts: %v", err)
	}
	for _, n := range names {
		src, _ := luaFiles.ReadFile(n)
		var head strings.Builder
		for _, line := range strings.Split(string(src), "\n") {
			if !strings.HasPrefix(line, "--") {
				break
			}
			head.WriteString(line + "\n")
		}
		h := head.String()
		if !(strings.Contains(h, "KEYS") && strings.Contains(h, "ARGV")) {
			t.Errorf("%s: the opening comment gives no KEYS and ARGV:\n%s", n, h)
		}
	}
}

// TestFireLayoutNames: every layout name fire.lua uses is defined by the
// prelude made from the Go constants (an undefined one would be nil in Lua
// and fail only on the path that reads it), and the prelude defines each
// name once.
func TestFireLayoutNames(t *testing.T) {
	t.Parallel()
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^local ([A-Z][A-Z0-9_]*) = `).FindAllStringSubmatch(fireLayoutLua, -1) {
		if defined[m[1]] {
			t.Errorf("%s defined twice", m[1])
		}
		defined[m[1]] = true
	}
	src, _ := luaFiles.ReadFile("lua/fire.lua")
	// The code without its comments and string literals.
	code := regexp.MustCompile(`--[^\n]*|'[^'\n]*'`).ReplaceAllString(string(src), "")
	used := 0
	for _, name := range regexp.MustCompile(`\b[A-Z][A-Z0-9_]+\b`).FindAllString(code, -1) {
		if name == "KEYS" || name == "ARGV" {
			continue
		}
		used++
		if !defined[name] {
			t.Errorf("fire.lua uses %s, which the Go layout does not define", name)
		}
	}
	if used < len(defined) {
		t.Errorf("fire.lua reads %d layout names, fewer than the %d defined", used, len(defined))
	}
}
