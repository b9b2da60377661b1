package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// stdConfigDecode is the reference: encoding/json alone, as
// DecodeConfigEvent's slow path decodes.
func stdConfigDecode(b []byte) (*Event, *Entry, error) {
	ev, err := DecodeEvent(b)
	if err != nil {
		return nil, nil, err
	}
	var e Entry
	if err := ev.DecodeData(&e); err != nil {
		return ev, nil, err
	}
	return ev, &e, nil
}

// sameAsStd fails t unless the fast decoder's result for b, when it takes b,
// is exactly encoding/json's.
func sameAsStd(t *testing.T, b []byte) (fast bool) {
	t.Helper()
	fe := new(Entry)
	fev, ok := decodeConfigFast(b, fe)
	if !ok {
		return false
	}
	// The envelope check is DecodeEvent's; compare the raw decoding.
	var sev Event
	if err := json.Unmarshal(b, &sev); err != nil {
		t.Fatalf("fast path took input encoding/json refuses (%v):\n%q", err, b)
	}
	var se Entry
	if err := json.Unmarshal(sev.Data, &se); err != nil {
		t.Fatalf("fast path took data encoding/json refuses (%v):\n%q", err, b)
	}
	if !bytes.Equal(fev.Data, sev.Data) {
		t.Fatalf("data differs:\nfast %q\nstd  %q", fev.Data, sev.Data)
	}
	fev.Data, sev.Data = nil, nil
	if !reflect.DeepEqual(*fev, sev) {
		t.Fatalf("envelope differs for %q:\nfast %+v\nstd  %+v", b, *fev, sev)
	}
	if !reflect.DeepEqual(*fe, se) {
		t.Fatalf("entry differs for %q:\nfast %#v\nstd  %#v", b, *fe, se)
	}
	return true
}

// randomEntry draws an entry with every field used some of the time,
// including text that encoding/json escapes.
func randomEntry(r *rand.Rand) Entry {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	e := Entry{
		ID:       fmt.Sprintf("e-%d", r.IntN(1e6)),
		Cron:     pick("* * * * *", "@every 5s", "CRON_TZ=Asia/Tokyo 0 9 * * 1-5", "0 30 2 * * *", "@daily"),
		Timezone: pick("", "UTC", "Europe/Berlin", "America/New_York"),
		Task: Task{
			Type: pick("report", "email:send", "ünïcødé:task", "a<b>&c", "tab\there", `quote"d`),
		},
		Overlap: OverlapPolicy(pick("", "allow", "skip")),
		Jitter:  Duration(time.Duration(r.IntN(5)) * time.Second),
		Paused:  r.IntN(2) == 0,
		Note:    pick("", "nightly", "line\nbreak", "日本語のメモ"),
		Owner:   pick("", "sync", "ops"),
		Removed: r.IntN(5) == 0,
	}
	if r.IntN(2) == 0 {
		p := make([]byte, r.IntN(64))
		for i := range p {
			p[i] = byte(r.IntN(256))
		}
		e.Task.Payload = p
	}
	if r.IntN(2) == 0 {
		e.Task.Headers = map[string]string{"source": "cron", pick("team", "ü", "x\\y"): pick("ops", "", "é")}
	}
	if r.IntN(2) == 0 {
		n := r.IntN(100) - 2
		e.Options.MaxRetry = &n
	}
	e.Options.Queue = pick("", "default", "critical", "a:b", "x{y}")
	e.Options.Timeout = Duration(time.Duration(r.IntN(3)) * time.Minute)
	e.Options.Deadline = Duration(time.Duration(r.IntN(3)) * time.Hour)
	e.Options.Unique = Duration(time.Duration(r.IntN(2)) * time.Minute)
	e.Options.Retention = Duration(time.Duration(r.IntN(2)) * 24 * time.Hour)
	e.Options.Group = pick("", "g1")
	e.Catchup = Catchup{Policy: CatchupPolicy(pick("", "none", "latest", "all")), Window: Duration(time.Duration(r.IntN(3)) * time.Hour)}
	if r.IntN(3) == 0 {
		e = e.Normalize()
	}
	return e
}

// TestFastDecodeMatchesStd: events as cronstream writes them, with every
// field drawn at random, decode identically on both paths, and the fast path
// takes every one whose strings need no escape.
func TestFastDecodeMatchesStd(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	fastCount := 0
	const n = 5000
	for range n {
		e := randomEntry(r)
		ev, err := NewEvent(ConfigTypes[r.IntN(len(ConfigTypes))], "test/"+e.ID, e.ID, e)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if r.IntN(4) == 0 {
			var buf bytes.Buffer
			if err := json.Indent(&buf, b, "", "  "); err != nil {
				t.Fatal(err)
			}
			b = buf.Bytes()
		}
		fast := sameAsStd(t, b)
		if fast {
			fastCount++
		} else if !bytes.Contains(b, []byte(`\`)) {
			t.Fatalf("fast path refused an event without escapes:\n%s", b)
		}
		// And the public decoder agrees with the reference on the verdict.
		_, got, gotErr := DecodeConfigEvent(b)
		wantEv, want, wantErr := stdConfigDecode(b)
		if wantErr == nil && !(want.Removed && wantEv.Type == TypeEntryRemoved) {
			// A removal needs only its id.
			if err := want.Validate(); err != nil {
				wantErr = err
			}
		}
		if (gotErr == nil) != (wantErr == nil) && !strings.Contains(fmt.Sprint(gotErr), "removed=") && !strings.Contains(fmt.Sprint(gotErr), "paused=") {
			t.Fatalf("verdict differs: got %v, reference %v\n%s", gotErr, wantErr, b)
		}
		if gotErr == nil && !reflect.DeepEqual(*got, want.Normalize()) {
			t.Fatalf("entry differs:\n%#v\n%#v", *got, want.Normalize())
		}
	}
	if fastCount < n/5 {
		t.Fatalf("fast path took only %d of %d events", fastCount, n)
	}
	t.Logf("fast path took %d of %d events", fastCount, n)
}

// TestFastDecodeLeavesTheRestToStd: inputs outside the subset are refused by
// the fast path, so encoding/json decides them (and its errors are the ones
// users see).
func TestFastDecodeLeavesTheRestToStd(t *testing.T) {
	const good = `{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","subject":"j","time":"2026-01-02T03:04:05Z","data":{"id":"j","cron":"@every 1s","task":{"type":"t"}}}`
	if !sameAsStd(t, []byte(good)) {
		t.Fatal("the plain event must take the fast path")
	}
	for name, in := range map[string]string{
		"case-folded key":  strings.Replace(good, `"cron"`, `"CRON"`, 1),
		"duplicate key":    strings.Replace(good, `"cron":"@every 1s"`, `"cron":"@every 1s","cron":"@every 2s"`, 1),
		"duplicate object": strings.Replace(good, `"task":{"type":"t"}`, `"task":{"type":"t"},"task":{"payload":"eA=="}`, 1),
		"escape":           strings.Replace(good, `"type":"t"`, `"type":"\u0074"`, 1),
		"null":             strings.Replace(good, `"task"`, `"note":null,"task"`, 1),
		"unknown key":      strings.Replace(good, `"task"`, `"future":1,"task"`, 1),
		"float":            strings.Replace(good, `"task"`, `"options":{"max_retry":1.0},"task"`, 1),
		"exponent":         strings.Replace(good, `"task"`, `"options":{"max_retry":1e2},"task"`, 1),
		"leading zero":     strings.Replace(good, `"task"`, `"options":{"max_retry":01},"task"`, 1),
		"overflow":         strings.Replace(good, `"task"`, `"options":{"max_retry":99999999999999999999},"task"`, 1),
		"number duration":  strings.Replace(good, `"task"`, `"jitter":30,"task"`, 1),
		"bad duration":     strings.Replace(good, `"task"`, `"jitter":"soon","task"`, 1),
		"bad base64":       strings.Replace(good, `"type":"t"`, `"type":"t","payload":"!!"`, 1),
		"bad time":         strings.Replace(good, `03:04:05Z`, `03:04:05`, 1),
		"invalid utf-8":    strings.Replace(good, `"type":"t"`, "\"type\":\"\xff\"", 1),
		"control char":     strings.Replace(good, `"type":"t"`, "\"type\":\"a\tb\"", 1),
		"trailing comma":   strings.Replace(good, `"type":"t"}`, `"type":"t",}`, 1),
		"trailing bytes":   good + "x",
		"trailing nul":     good + "\x00",
		"bool as string":   strings.Replace(good, `"task"`, `"paused":"true","task"`, 1),
		"truthy literal":   strings.Replace(good, `"task"`, `"paused":truex,"task"`, 1),
		"data not object":  strings.Replace(good, `"data":{`, `"data":[{`, 1) + "]",
		"no data":          `{"specversion":"1.0","id":"a","type":"cronstream.entry.updated"}`,
		"header not text":  strings.Replace(good, `"type":"t"`, `"type":"t","headers":{"a":1}`, 1),
		"top-level array":  "[" + good + "]",
		"empty":            ``,
	} {
		t.Run(name, func(t *testing.T) {
			if _, ok := decodeConfigFast([]byte(in), new(Entry)); ok {
				t.Fatalf("fast path took %q", in)
			}
		})
	}
}

func FuzzDecodeConfigFast(f *testing.F) {
	seedGolden(f)
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		e := randomEntry(r)
		ev, _ := NewEvent(TypeEntryUpdated, "fuzz", e.ID, e)
		b, _ := ev.Marshal()
		f.Add(b)
	}
	// Text encoding/json repairs: invalid UTF-8 and halves of surrogate
	// pairs, in the entry and in the envelope.
	for _, s := range []string{
		"{\"specversion\":\"1.0\",\"id\":\"a\",\"type\":\"cronstream.entry.updated\",\"data\":{\"id\":\"j\",\"cron\":\"@every 1s\",\"task\":{\"type\":\"t\xff\"}}}",
		`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","data":{"id":"j","cron":"@every 1s","task":{"type":"t"},"options":{"queue":"q\ud800"}}}`,
		`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","data":{"id":"j","cron":"@every 1s","task":{"type":"t"},"note":"\ud83d\ude00"}}`,
		"{\"specversion\":\"1.0\",\"id\":\"a\",\"source\":\"\xc3\",\"type\":\"cronstream.entry.updated\",\"data\":{\"id\":\"j\",\"cron\":\"@every 1s\",\"task\":{\"type\":\"t\"}}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameAsStd(t, b)
		// The public decoder never panics, what it accepts is valid, and
		// it is what the publisher wrote: never a U+FFFD encoding/json put
		// in place of bytes it could not read.
		if ev, e, err := DecodeConfigEvent(b); err == nil {
			if verr := e.Validate(); verr != nil {
				t.Fatalf("accepted an invalid entry: %v", verr)
			}
			noRepair(t, b, ev, e)
		}
	})
}

func BenchmarkDecodeConfigEvent(b *testing.B) {
	e := Entry{
		ID: "entry-000042", Cron: "*/5 * * * *", Timezone: "Europe/Berlin",
		Task:    Task{Type: "report:42", Payload: []byte(`{"tenant":42,"format":"pdf"}`), Headers: map[string]string{"source": "cron"}},
		Options: Options{Queue: "reports", Timeout: Duration(10 * time.Minute)},
		Owner:   "sync",
	}.Normalize()
	ev, err := NewEvent(TypeEntryUpdated, "bench", e.ID, e)
	if err != nil {
		b.Fatal(err)
	}
	data, err := ev.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := DecodeConfigEvent(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, e, err := stdConfigDecode(data)
			if err != nil {
				b.Fatal(err)
			}
			n := e.Normalize()
			if err := n.Validate(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestRecurringValuesShared decodes the events of many entries on several
// goroutines at once, as the projector does: each entry must come out
// exactly as encoding/json reads it, and a value the entries repeat (a
// queue, a zone, a header) must be one copy, not one per entry.
func TestRecurringValuesShared(t *testing.T) {
	const entries = 400
	data := make([][]byte, entries)
	for i := range data {
		e := Entry{
			ID: fmt.Sprintf("e-%03d", i), Cron: []string{"*/5 * * * *", "@hourly"}[i%2], Timezone: "Europe/Berlin",
			Task:    Task{Type: "report", Payload: []byte(fmt.Sprint(i)), Headers: map[string]string{"team": "ops"}},
			Options: Options{Queue: "reports"},
			Owner:   "sync",
		}
		ev, err := NewEvent(TypeEntryUpdated, "test", e.ID, e)
		if err != nil {
			t.Fatal(err)
		}
		if data[i], err = ev.Marshal(); err != nil {
			t.Fatal(err)
		}
	}
	// The table's seed is random, so two of the strings these events carry
	// can share a slot and take turns in it: a seed that keeps the values
	// checked below apart makes the test mean the same in every run.
	useSeedApart(t, data, "reports", "Europe/Berlin", "sync", "team", "ops")
	got := make([]*Entry, entries)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < entries; i += 4 {
				_, e, err := DecodeConfigEvent(data[i])
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = e
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, e := range got {
		_, want, err := stdConfigDecode(data[i])
		if err != nil {
			t.Fatal(err)
		}
		want.normalize()
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("entry %d:\ngot  %#v\nwant %#v", i, e, want)
		}
	}
	// The table is lossy, so copies may differ for a while; what recurs
	// must settle on one.
	last := got[entries-1]
	for _, v := range []struct {
		name     string
		got, was string
	}{
		{"queue", got[entries-2].Options.Queue, last.Options.Queue},
		{"timezone", got[entries-2].Timezone, last.Timezone},
		{"owner", got[entries-2].Owner, last.Owner},
		{"header", got[entries-2].Task.Headers["team"], last.Task.Headers["team"]},
	} {
		if unsafe.StringData(v.got) != unsafe.StringData(v.was) {
			t.Errorf("%s %q is held twice", v.name, v.got)
		}
	}
	if unsafe.StringData(got[entries-2].ID) == unsafe.StringData(last.ID) {
		t.Error("ids share their bytes")
	}
}

// useSeedApart gives the decoders, for the rest of t, a table of recurring
// strings whose seed hashes each of values to a slot that no other string
// of events hashes to.
func useSeedApart(t *testing.T, events [][]byte, values ...string) {
	t.Helper()
	strs := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			strs[v] = true
		case map[string]any:
			for k, x := range v {
				strs[k] = true
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	for _, b := range events {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		walk(v)
	}
	for range 10000 {
		table := &recurringStrings{seed: maphash.MakeSeed()}
		taken := map[uint64]int{}
		for s := range strs {
			taken[maphash.String(table.seed, s)%recurringSlots]++
		}
		apart := true
		for _, v := range values {
			apart = apart && taken[maphash.String(table.seed, v)%recurringSlots] == 1
		}
		if apart {
			was := recurring
			recurring = table
			t.Cleanup(func() { recurring = was })
			return
		}
	}
	t.Fatal("no seed keeps the values apart")
}

// TestDecodeIntoUsedEntry: decoding into an entry that held another one
// leaves nothing of the old one behind, on the fast path and the slow.
func TestDecodeIntoUsedEntry(t *testing.T) {
	old := Entry{
		ID: "old", Cron: "@daily", Note: "old note", Labels: map[string]string{"a": "b"}, Exclude: []string{"@weekly"}, MaxFires: 3,
		Task: Task{Type: "t", Headers: map[string]string{"h": "v"}},
	}
	fresh := Entry{ID: "new", Cron: "@hourly", Task: Task{Type: "t"}}
	for name, encode := range map[string]func(*testing.T) []byte{
		"fast": func(t *testing.T) []byte {
			ev, err := NewEvent(TypeEntryUpdated, "test", fresh.ID, fresh)
			if err != nil {
				t.Fatal(err)
			}
			b, err := ev.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"encoding/json": func(*testing.T) []byte {
			return []byte(`{"id":"x","specversion":"1.0","source":"test","type":"cronstream.entry.updated","subject":"new","time":"2026-01-02T03:04:05Z",` +
				`"data":{"task":{"type":"t"},"id":"new","cron":"@hourl\u0079"}}`)
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := encode(t)
			if _, fast := decodeConfigFast(b, new(Entry)); fast != (name == "fast") {
				t.Fatalf("fast path took it: %t", fast)
			}
			_, want, err := DecodeConfigEvent(b)
			if err != nil {
				t.Fatal(err)
			}
			e := old.Clone()
			if _, err := DecodeConfigEventInto(b, &e); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(&e, want) {
				t.Fatalf("got  %#v\nwant %#v", e, *want)
			}
		})
	}
}
