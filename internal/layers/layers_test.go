package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

const module = "github.com/cronstream/cronstream"

// Module path prefixes the never lists name.
const (
	natsMods  = "github.com/nats-io/"
	redisMods = "github.com/redis/"
	asynqMods = "github.com/hibiken/asynq"
)

// layer is one level of the drawing, bottom first. Its packages (paths
// inside the module) may import packages of lower layers; inside the layer
// only the arrows in same ("from -> to"). never are module path prefixes
// that none of its packages may depend on, directly or through others.
type layer struct {
	name  string
	pkgs  []string
	same  []string
	never []string
}

// layers is the drawing (docs/design.md, "Components and their owners").
// Only non-test imports count: a test may import anything.
var layers = []layer{
	{
		name:  "contract: the event vocabulary and leaf helpers",
		pkgs:  []string{"contract", "internal/clock", "internal/redact", "internal/lifecycle", "internal/proccpu"},
		never: []string{natsMods, redisMods, asynqMods},
	},
	{
		name:  "pure: schedule math and record forms, on the contract",
		pkgs:  []string{"schedule", "internal/outbox", "internal/asynqconv"},
		never: []string{natsMods, redisMods, asynqMods},
	},
	{
		name: "IO: the NATS client and the Redis layer",
		pkgs: []string{"streamclient", "internal/redisscript", "internal/taskstate"},
		same: []string{"internal/taskstate -> internal/redisscript"},
		// Per package: see apart.
		never: []string{asynqMods},
	},
	{
		name:  "the public events facade and the projection",
		pkgs:  []string{"events", "projector"},
		same:  []string{"projector -> events"},
		never: []string{asynqMods},
	},
	{
		name:  "libraries the command line and the public tools build on",
		pkgs:  []string{"configsync", "audit", "internal/asynqimport"},
		never: []string{asynqMods},
	},
	{
		name: "views: read, never fire",
		pkgs: []string{"internal/entrystate", "internal/shardview", "internal/forecast", "internal/stall", "internal/console"},
		same: []string{
			"internal/console -> internal/entrystate",
			"internal/console -> internal/shardview",
			"internal/console -> internal/forecast",
			"internal/console -> internal/stall",
		},
		never: []string{asynqMods},
	},
	{
		name: "engines: one loop each",
		pkgs: []string{
			"internal/scheduler", "internal/recoverer", "internal/relay", "internal/ownership",
			"internal/failpause", "internal/keygc",
		},
		// ownership implements the scheduler's Shards.
		same:  []string{"internal/ownership -> internal/scheduler"},
		never: []string{asynqMods},
	},
	{
		name:  "wiring of one replica",
		pkgs:  []string{"internal/replica"},
		never: []string{asynqMods},
	},
	{
		name: "programs and public tools",
		pkgs: []string{"cmd/cronstream", "asynqcompat", "examples/worker"},
		// The binary stays free of asynq; asynqcompat and the example
		// worker are asynq's users.
	},
	{
		name: "test support: imported by tests only",
		pkgs: []string{
			"internal/testenv", "internal/replicatest", "internal/massrecovery", "internal/testlog", "internal/errtree",
			"internal/promtest", "internal/eventtest", "internal/firetest", "internal/projectiontest", "internal/rawjson",
		},
		// The mass-recovery scene starts its Redis through testenv.
		same: []string{"internal/massrecovery -> internal/testenv"},
	},
	{
		name: "test-only packages",
		pkgs: []string{"chaos", "internal/systembench", "internal/scalesim", "internal/deploycheck", "internal/layers"},
	},
}

// apart are what single packages must not depend on beyond their layer's
// never: the Redis layer no NATS, the NATS client no Redis, the binary no
// asynq.
var apart = map[string][]string{
	"streamclient":         {redisMods},
	"internal/redisscript": {natsMods},
	"internal/taskstate":   {natsMods},
	"cmd/cronstream":       {asynqMods},
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// listModule returns every package of the module with its non-test
// imports and dependencies.
func listModule(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,Error", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	return pkgs
}

// violations checks pkgs against the drawing and returns one line per
// arrow or dependency it forbids, and per package it does not place.
func violations(pkgs []pkg) []string {
	level := map[string]int{}
	allowed := map[string]bool{}
	for i, l := range layers {
		for _, p := range l.pkgs {
			level[p] = i
		}
		for _, a := range l.same {
			allowed[a] = true
		}
	}
	var bad []string
	seen := map[string]bool{}
	for _, p := range pkgs {
		name := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		seen[name] = true
		lp, ok := level[name]
		if !ok {
			bad = append(bad, name+" is in no layer: place it in the table of layers_test.go and in docs/design.md")
			continue
		}
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, module+"/")
			if !ours {
				continue
			}
			ld, ok := level[dep]
			switch {
			case !ok:
				// Reported as unplaced on its own.
			case ld > lp:
				bad = append(bad, name+" imports "+dep+", a layer above its own ("+layers[ld].name+")")
			case ld == lp && !allowed[name+" -> "+dep]:
				bad = append(bad, name+" imports "+dep+", in its own layer ("+layers[lp].name+"), an arrow the table does not allow")
			}
		}
		never := append(slices.Clone(layers[lp].never), apart[name]...)
		for _, n := range never {
			// One line per forbidden module: its first package.
			if i := slices.IndexFunc(p.Deps, func(d string) bool { return strings.HasPrefix(d, n) }); i >= 0 {
				bad = append(bad, name+" depends on "+p.Deps[i]+" (directly or through the packages it imports)")
			}
		}
	}
	for name := range level {
		if !seen[name] {
			bad = append(bad, "the table places "+name+", which is not a package of the module")
		}
	}
	slices.Sort(bad)
	return slices.Compact(bad)
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestLayers: the module's packages import as the layers allow.
func TestLayers(t *testing.T) {
	for _, v := range violations(listModule(t)) {
		t.Error(v)
	}
}

// TestLayersCatchBackArrows: the check finds each kind of forbidden import
// (a view importing the firing engine, NATS under the Redis layer, an
// engine importing another, an unplaced package), so TestLayers passing
// means something.
func TestLayersCatchBackArrows(t *testing.T) {
	base := []pkg{
		{ImportPath: module + "/contract"},
		{ImportPath: module + "/internal/console", Imports: []string{module + "/internal/stall"}},
		{ImportPath: module + "/internal/stall"},
		{ImportPath: module + "/internal/scheduler", Imports: []string{module + "/contract"}},
		{ImportPath: module + "/internal/ownership", Imports: []string{module + "/internal/scheduler"}},
		{ImportPath: module + "/internal/taskstate", Deps: []string{redisMods + "go-redis/v9"}},
	}
	// Every placed package is listed, so the table's own check is quiet.
	var all []pkg
	placed := map[string]bool{}
	for _, p := range base {
		placed[p.ImportPath] = true
	}
	for _, l := range layers {
		for _, p := range l.pkgs {
			if !placed[module+"/"+p] {
				all = append(all, pkg{ImportPath: module + "/" + p})
			}
		}
	}
	all = append(all, base...)
	if v := violations(all); len(v) > 0 {
		t.Fatalf("the allowed arrows are reported: %q", v)
	}
	for _, c := range []struct {
		name string
		add  pkg
		want string
	}{
		{"view imports the engine", pkg{ImportPath: module + "/internal/forecast", Imports: []string{module + "/internal/scheduler"}}, "internal/forecast imports internal/scheduler, a layer above"},
		{"Redis layer depends on NATS", pkg{ImportPath: module + "/internal/taskstate", Deps: []string{natsMods + "nats.go"}}, "internal/taskstate depends on github.com/nats-io/nats.go"},
		{"contract depends on Redis", pkg{ImportPath: module + "/contract", Deps: []string{redisMods + "go-redis/v9"}}, "contract depends on github.com/redis/go-redis/v9"},
		{"engine imports an engine", pkg{ImportPath: module + "/internal/relay", Imports: []string{module + "/internal/recoverer"}}, "internal/relay imports internal/recoverer, in its own layer"},
		{"unplaced package", pkg{ImportPath: module + "/internal/newthing"}, "internal/newthing is in no layer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := violations(append(slices.Clone(all), c.add))
			if len(got) != 1 || !strings.HasPrefix(got[0], c.want) {
				t.Errorf("violations = %q, want one starting %q", got, c.want)
			}
		})
	}
}
