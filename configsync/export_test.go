package configsync

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// entryGen makes a random valid value for each field of events.Entry, by
// its Go path. TestExportRoundTrip walks the Entry type and fails on a
// field without a generator here, so a field added later cannot be left
// out of the export.
var entryGen = map[string]func(r *rand.Rand, i int) any{
	"ID": func(r *rand.Rand, i int) any { return fmt.Sprintf("e%d-%s", i, pick(r, "a", "B_c", "x-y")) },
	"Cron": func(r *rand.Rand, _ int) any {
		return pick(r, "@daily", "@every 90s", "0 9 * * 1-5", "*/5 * * * * *", "CRON_TZ=Asia/Tokyo 30 2 * * *", "0 18 LW * *", "0 9 ? * MON#1,5L")
	},
	"Timezone": func(r *rand.Rand, _ int) any {
		return pick(r, "", "UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires")
	},
	"Task.Type": func(r *rand.Rand, _ int) any {
		return pick(r, "report:daily", "tâche:été", "a b") + randString(r, 6)
	},
	"Task.Payload": func(r *rand.Rand, _ int) any { return randPayload(r) },
	"Task.Headers": func(r *rand.Rand, _ int) any {
		if r.IntN(3) == 0 {
			return map[string]string(nil)
		}
		h := map[string]string{}
		for range 1 + r.IntN(4) {
			h["k"+randString(r, 5)] = randString(r, 12)
		}
		return h
	},
	"Options.Queue": func(r *rand.Rand, _ int) any {
		return pick(r, "", "default", "critical") + strings.TrimLeft(randString(r, 4), "}")
	},
	"Options.MaxRetry": func(r *rand.Rand, _ int) any {
		if r.IntN(3) == 0 {
			return (*int)(nil)
		}
		n := r.IntN(30)
		return &n
	},
	"Options.Timeout":   func(r *rand.Rand, _ int) any { return randDur(r, time.Second, 2*time.Hour) },
	"Options.Deadline":  func(r *rand.Rand, _ int) any { return randDur(r, time.Second, 2*time.Hour) },
	"Options.Unique":    func(r *rand.Rand, _ int) any { return randDur(r, time.Second, time.Hour) },
	"Options.Retention": func(r *rand.Rand, _ int) any { return randDur(r, time.Second, 48*time.Hour) },
	"Options.Group":     func(r *rand.Rand, _ int) any { return pick(r, "", "grp") + randString(r, 3) },
	"Catchup.Policy": func(r *rand.Rand, _ int) any {
		return events.CatchupPolicy(pick(r, "", "none", "latest", "all"))
	},
	"Catchup.Window": func(r *rand.Rand, _ int) any { return randDur(r, time.Millisecond, 300*24*time.Hour) },
	"Overlap":        func(r *rand.Rand, _ int) any { return events.OverlapPolicy(pick(r, "", "allow", "skip")) },
	"Jitter":         func(r *rand.Rand, _ int) any { return randDur(r, time.Millisecond, 24*time.Hour) },
	"Paused":         func(r *rand.Rand, _ int) any { return r.IntN(2) == 0 },
	"Note":           func(r *rand.Rand, _ int) any { return randString(r, 20) },
	"Owner":          func(r *rand.Rand, _ int) any { return pick(r, "", "sync", "team-ä") },
	"PauseOnFailure": func(r *rand.Rand, _ int) any { return r.IntN(2) == 0 },
	"TickHeaders":    func(r *rand.Rand, _ int) any { return r.IntN(2) == 0 },
	// An export holds live entries only.
	"Removed": func(*rand.Rand, int) any { return false },
	// Start in 2026, end in 2028: always a valid window.
	"StartAt": func(r *rand.Rand, _ int) any { return randTime(r, 2026) },
	"EndAt":   func(r *rand.Rand, _ int) any { return randTime(r, 2028) },
	"Exclude": func(r *rand.Rand, _ int) any {
		if r.IntN(2) == 0 {
			return []string(nil)
		}
		return []string{pick(r, "* * 25 12 *", "0 0 * * 0"), "*/5 * * * * *"}[:1+r.IntN(2)]
	},
	"Labels": func(r *rand.Rand, _ int) any {
		if r.IntN(3) == 0 {
			return map[string]string(nil)
		}
		return map[string]string{"team": pick(r, "payments", "ops", ""), "example.com/tier": "a-1_b.c"}
	},
	"MaxFires": func(r *rand.Rand, _ int) any { return []int{0, 1, 5, 1000}[r.IntN(4)] },
}

// randTime is zero or a whole second of year y, in a random zone (the
// stored form is UTC).
func randTime(r *rand.Rand, y int) time.Time {
	if r.IntN(3) == 0 {
		return time.Time{}
	}
	t := time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.Int64N(365*24*3600)) * time.Second)
	return t.In(time.FixedZone("", 3600*(r.IntN(25)-12)))
}

// alwaysZero are fields the generator leaves zero on purpose.
var alwaysZero = map[string]bool{"Removed": true}

func pick(r *rand.Rand, s ...string) string { return s[r.IntN(len(s))] }

// randString mixes ASCII, YAML-significant characters, non-ASCII text and
// control characters.
func randString(r *rand.Rand, max int) string {
	pool := []rune("aZ09 _-:#'\"{}[]&*!|>%@`\\\n\t\r\x00\x7féß日本🙂\u2028\u0085\ufeff")
	var b strings.Builder
	for range r.IntN(max + 1) {
		b.WriteRune(pool[r.IntN(len(pool))])
	}
	return b.String()
}

func randDur(r *rand.Rand, unit, max time.Duration) events.Duration {
	if r.IntN(3) == 0 {
		return 0
	}
	return events.Duration(unit * time.Duration(1+r.Int64N(int64(max/unit))))
}

func randPayload(r *rand.Rand) []byte {
	switch r.IntN(7) {
	case 0:
		return nil
	case 1: // binary
		b := make([]byte, 1+r.IntN(64))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return b
	case 2: // JSON as an encoder writes it
		b, _ := json.Marshal(map[string]any{"to": randString(r, 8), "n": r.IntN(1000), "list": []any{1.5, nil, true}})
		return b
	case 3: // JSON as a person writes it: spaces, order, escapes kept as written
		return []byte("{ \"z\": 1,\n  \"a\": \"caf\\u00e9\", \"x\": 1e3 }")
	case 4: // JSON whose text is a base64 string: must stay that string
		return []byte(`"eyJ0byI6IndvcmxkIn0="`)
	case 5: // non-ASCII text
		return []byte("grüße aus 東京 " + randString(r, 5))
	}
	return []byte(randString(r, 30))
}

// leafFields lists the paths of Entry's fields, descending into structs.
func leafFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		path := prefix + f.Name
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() {
			out = append(out, leafFields(f.Type, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

func fieldByPath(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
	}
	return v
}

func randomEntry(t *testing.T, r *rand.Rand, i int, paths []string) events.Entry {
	var e events.Entry
	v := reflect.ValueOf(&e).Elem()
	for _, p := range paths {
		gen, ok := entryGen[p]
		if !ok {
			t.Fatalf("events.Entry field %s has no generator in entryGen: add one, and make Export and Parse carry it", p)
		}
		f := fieldByPath(v, p)
		if g := reflect.ValueOf(gen(r, i)); g.IsValid() {
			f.Set(g.Convert(f.Type()))
		} else {
			f.Set(reflect.Zero(f.Type()))
		}
	}
	return e
}

// TestExportRoundTrip: random entries (binary, JSON and non-ASCII
// payloads; every field of events.Entry) exported and synced into a fresh
// stream come back identical, and syncing the export onto the stream it
// came from publishes nothing.
func TestExportRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	js := testenv.StartNATS(t).JetStream(t)
	client := func(prefix string) *events.Client {
		names := events.MustNames(prefix)
		if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
			t.Fatal(err)
		}
		return events.NewClient(js, names, events.WithSource("configsync/test"))
	}
	src, dst := client("src"), client("dst")

	paths := leafFields(reflect.TypeOf(events.Entry{}), "")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	const n = 150
	set := map[string]bool{}
	for i := range n {
		e := randomEntry(t, r, i, paths)
		if err := e.Validate(); err != nil {
			t.Fatalf("generated an invalid entry: %v", err)
		}
		ev := reflect.ValueOf(e)
		for _, p := range paths {
			if !fieldByPath(ev, p).IsZero() {
				set[p] = true
			}
		}
		if _, err := src.Put(ctx, e); err != nil {
			t.Fatalf("put %s: %v", e.ID, err)
		}
	}
	for _, p := range paths {
		if !set[p] && !alwaysZero[p] {
			t.Errorf("no generated entry sets %s", p)
		}
	}

	want, err := src.List(ctx)
	if err != nil || len(want) != n {
		t.Fatalf("list src: %d entries, %v", len(want), err)
	}
	var entries []events.Entry
	for _, c := range want {
		entries = append(entries, c.Entry)
	}
	var file bytes.Buffer
	if err := Export(&file, entries); err != nil {
		t.Fatal(err)
	}
	cfgs, err := Parse(file.Bytes(), "export.yaml")
	if err != nil {
		t.Fatalf("the export does not parse: %v", err)
	}

	if p := MakePlan(want, cfgs, DefaultOwner, true); !p.Empty() {
		t.Errorf("syncing the export onto its own stream plans %d actions, first %+v", len(p.Actions), p.Actions[0].Changes)
	}

	if _, err := Apply(ctx, dst, MakePlan(nil, cfgs, DefaultOwner, true)); err != nil {
		t.Fatalf("sync the export into a fresh stream: %v", err)
	}
	got, err := dst.List(ctx)
	if err != nil || len(got) != n {
		t.Fatalf("list dst: %d entries, %v", len(got), err)
	}
	for i := range want {
		if !reflect.DeepEqual(want[i].Entry, got[i].Entry) {
			a, _ := json.Marshal(want[i].Entry)
			b, _ := json.Marshal(got[i].Entry)
			t.Errorf("entry %s changed in the round trip:\nwas %s\nnow %s", want[i].ID, a, b)
		}
	}
	if t.Failed() {
		t.Logf("export:\n%s", file.String())
	}
}

// TestExportPayloadForms: each payload is written in the form that keeps
// its bytes and reads best.
func TestExportPayloadForms(t *testing.T) {
	for _, tc := range []struct {
		payload []byte
		key     string
	}{
		{[]byte(`{"to":"world"}`), "payload_json:"},
		{[]byte(`"eyJ0byI6IndvcmxkIn0="`), "payload_json:"},
		{[]byte("hello wörld"), "payload: hello wörld"},
		{[]byte("two\nlines"), "payload_base64: dHdvCmxpbmVz"},
		{[]byte{0xff, 0x00}, "payload_base64: /wA="},
	} {
		var b bytes.Buffer
		e := events.Entry{ID: "a", Cron: "@daily", Task: events.Task{Type: "t", Payload: tc.payload}}
		if err := Export(&b, []events.Entry{e}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.key) {
			t.Errorf("payload %q exported as\n%s\nwant %s", tc.payload, b.String(), tc.key)
		}
		cfgs, err := Parse(b.Bytes(), "x")
		if err != nil || !bytes.Equal(cfgs[0].Entry.Task.Payload, tc.payload) {
			t.Errorf("payload %q read back as %v, %v", tc.payload, cfgs, err)
		}
	}
}

// TestExportUnowned leaves owner and pause state to the sync that reads
// the file: parsed back, every other field is the same.
func TestExportUnowned(t *testing.T) {
	in := []events.Entry{
		{ID: "a", Cron: "@daily", Task: events.Task{Type: "a", Payload: []byte(`{"x":1}`)}, Owner: "someone", Paused: true, Note: "n",
			Labels: map[string]string{"team": "ops"}, StartAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "b", Cron: "*/5 * * * *", Timezone: "Europe/Berlin", Task: events.Task{Type: "b"}, Options: events.Options{Queue: "q"}},
	}
	var b bytes.Buffer
	if err := ExportUnowned(&b, in); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "owner:") || strings.Contains(b.String(), "paused:") {
		t.Fatalf("owner or pause state written:\n%s", b.String())
	}
	cfgs, err := Parse(b.Bytes(), "export")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cfgs {
		if c.Owner != nil || c.Paused != nil {
			t.Errorf("%s: owner %v paused %v, want both left to the sync", c.Entry.ID, c.Owner, c.Paused)
		}
		want := in[i]
		want.Owner, want.Paused = "", false
		if !events.SameContent(c.Entry, want) {
			t.Errorf("%s read back as %+v, want %+v", c.Entry.ID, c.Entry, want)
		}
	}
}
