package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// seedGolden adds every golden event file to a fuzz corpus.
func seedGolden(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.json"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	seedGolden(f)
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `"x"`, `{"specversion":"1.0","id":"a","type":"t"}`,
		`[{"specversion":"1.0","id":"a","type":"t"},{"specversion":"1.0","id":"b","type":"t"}]`, `[{}]`, `[1,{"specversion":"1.0","id":"a","type":"t"}]`,
		`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","subject":"j","time":"2026-01-02T03:04:05Z","data":{"id":"j","cron":"@every 1s","task":{"type":"t"}}}`,
		`{"specversion":"1.0","id":"a","type":"cronstream.entry.updated","data":{"jitter":30}}`,
		`{"specversion":"1.0","id":"a","type":"t","time":"2026-13-45T99:00:00Z"}`,
		`{"specversion":"1.0","id":"a","type":"cronstream.entry.removed","subject":"j","data":{"id":"j","cron":"CRON_TZ=Europe/Berlin 0 0 31 2 *","task":{"type":"t"},"removed":true}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Read as an activity message (a batch or one event): every
		// error wraps ErrMalformedEvent, and a batch's events are each
		// what DecodeEvent reads.
		if evs, err := DecodeEvents(b); err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("DecodeEvents error %v does not wrap ErrMalformedEvent", err)
			}
		} else if IsBatch(b) {
			parts, _ := SplitEvents(b)
			for i, p := range parts {
				if ev, err := DecodeEvent(p); err != nil || ev.ID != evs[i].ID {
					t.Fatalf("batch element %d decodes differently alone: %v", i, err)
				}
			}
		}
		ev, err := DecodeEvent(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedEvent) {
				t.Fatalf("error %v does not wrap ErrMalformedEvent", err)
			}
			return
		}
		// A decoded event re-encodes and decodes to the same envelope.
		raw, err := ev.Marshal()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := DecodeEvent(raw)
		if err != nil {
			t.Fatalf("decode of re-encoded event: %v\n%s", err, raw)
		}
		if back.ID != ev.ID || back.Type != ev.Type || back.Subject != ev.Subject || !back.Time.Equal(ev.Time) {
			t.Fatalf("round trip changed the envelope: %+v vs %+v", back, ev)
		}
		// A config reader never panics, and what it accepts is valid, or
		// a removal naming its entry.
		if ev, e, err := DecodeConfigEvent(b); err == nil {
			if ev.Type == TypeEntryRemoved && e.Removed {
				if e.ID == "" {
					t.Fatalf("DecodeConfigEvent accepted a removal without an id")
				}
			} else if verr := e.Validate(); verr != nil {
				t.Fatalf("DecodeConfigEvent accepted an invalid entry: %v", verr)
			}
			noRepair(t, b, ev, e)
		} else if !errors.Is(err, ErrMalformedEvent) {
			t.Fatalf("config decode error %v does not wrap ErrMalformedEvent", err)
		}
	})
}

func FuzzValidateEntry(f *testing.F) {
	for _, g := range goldenEvents() {
		if e, ok := g.data.(Entry); ok {
			b, _ := json.Marshal(e)
			f.Add(b)
		}
	}
	for _, s := range []string{
		`{}`, `{"id":"a","cron":"* * * * *","task":{"type":"t"}}`,
		`{"id":"a","cron":"@every 1h","task":{"type":"t"},"options":{"max_retry":-5}}`,
		`{"id":"a","cron":"TZ=UTC 0 0 * * *","timezone":"Local","task":{"type":"t"}}`,
		`{"id":"a","cron":"0 0 30 2 *","task":{"type":"t"},"catchup":{"policy":"all","window":"8784h"}}`,
		`{"id":"a","cron":"*/0 * * * *","task":{"type":"t"}}`,
		`{"id":"a","cron":"@every 9223372036s","task":{"type":"t"}}`,
		`{"id":"a","cron":"1-1000000000 * * * *","task":{"type":"t"}}`,
		`{"id":"a","cron":"0 0 LW * *","timezone":"Australia/Lord_Howe","task":{"type":"t"}}`,
		`{"id":"a","cron":"0 30 2 ? 3 0#5","timezone":"Europe/Berlin","task":{"type":"t"},"exclude":["0 0 L * *"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte("{\"id\":\"a\",\"cron\":\"* * * * *\",\"task\":{\"type\":\"t\xff\"}}"))
	f.Add([]byte(`{"id":"a","cron":"* * * * *","task":{"type":"t"},"options":{"queue":"\udc00"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Entry
		if json.Unmarshal(b, &e) != nil {
			return
		}
		err := e.Validate()
		sameVerdictRaw(t, b, e, err)
		if err != nil {
			if !errors.Is(err, ErrInvalidEntry) || len(fieldsOf(err)) == 0 {
				t.Fatalf("validation error %v names no field", err)
			}
			return
		}
		// A valid entry survives the trip through the stream: normalized,
		// encoded, decoded, it is still valid and the same.
		n := e.Normalize()
		raw, err := json.Marshal(n)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		var back Entry
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("decode of %s: %v", raw, err)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("valid entry invalid after a round trip: %v\n%s", err, raw)
		}
		if !SameContent(e, back) {
			t.Fatalf("round trip changed the entry:\n%s", raw)
		}
	})
}

// sameVerdictRaw checks that the entry JSON b, published raw as a config
// event's data, is accepted exactly when validation accepts what
// encoding/json reads from it (e, whose verdict is verr) and encoding/json
// had nothing to repair: the stream judges a raw publisher as Validate
// judges the CLI's values.
func sameVerdictRaw(t *testing.T, b []byte, e Entry, verr error) {
	t.Helper()
	typ := TypeEntryUpdated
	switch {
	case e.Removed:
		typ = TypeEntryRemoved
	case e.Paused:
		typ = TypeEntryPaused
	}
	typ = GatedType(typ, e)
	want := (verr == nil || typ == TypeEntryRemoved && e.ID != "") && repairedAt(b) < 0
	if IsGatedType(typ) {
		// Gated data is decoded strictly: a field this build does not
		// know is refused.
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		var strict Entry
		want = want && d.Decode(&strict) == nil
	}
	ev := []byte(`{"specversion":"1.0","id":"x","type":"` + typ + `","data":` + string(b) + `}`)
	_, _, err := DecodeConfigEvent(ev)
	if (err == nil) != want {
		t.Fatalf("raw publish verdict %v, validation's %v (repair at %d)\n%q", err, verr, repairedAt(b), b)
	}
}

func FuzzQueueToken(f *testing.F) {
	for _, s := range []string{"", "default", "critical", "a.b", "*", ">", " ", "~", "~7e", "~~", "é", "\x00", "q\t1", "}x", "~2e", "~2E", "~41", "~g0", "a~"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkQueueToken(t, s)
		// Decoding arbitrary input never panics, and what decodes is the
		// canonical token of its result.
		if q, err := DecodeQueueToken(s); err == nil {
			if EncodeQueueToken(q) != s {
				t.Fatalf("token %q decodes to %q, which encodes to %q", s, q, EncodeQueueToken(q))
			}
		}
	})
}

// checkQueueToken asserts the encoding's properties for one queue name.
func checkQueueToken(t *testing.T, queue string) {
	t.Helper()
	tok := EncodeQueueToken(queue)
	if tok == "" {
		t.Fatalf("queue %q: empty token", queue)
	}
	for _, r := range tok {
		if r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || r > unicode.MaxASCII || !unicode.IsPrint(r) {
			t.Fatalf("queue %q: token %q contains %q", queue, tok, r)
		}
	}
	back, err := DecodeQueueToken(tok)
	if err != nil || back != queue {
		t.Fatalf("queue %q: token %q decodes to %q, %v", queue, tok, back, err)
	}
	names := MustNames("p")
	if q, ok := names.QueueFromRecoverySubject(names.RecoverySubject(queue)); !ok || q != queue {
		t.Fatalf("queue %q: recovery subject round trip gives %q %v", queue, q, ok)
	}
}

func TestQueueTokenProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(2, 7))
	alphabets := []string{
		"abcXYZ019_-",
		".*> \t\n\r~",
		"äöü€😀日本",
	}
	seen := map[string]string{}
	for i := range 20000 {
		var b strings.Builder
		n := rng.IntN(40)
		for range n {
			switch rng.IntN(4) {
			case 0: // any byte, including invalid UTF-8
				b.WriteByte(byte(rng.IntN(256)))
			default:
				alpha := []rune(alphabets[rng.IntN(len(alphabets))])
				b.WriteRune(alpha[rng.IntN(len(alpha))])
			}
		}
		q := b.String()
		if i%1000 == 0 {
			q = strings.Repeat(q, 10)
		}
		checkQueueToken(t, q)
		// Distinct queues never share a token.
		tok := EncodeQueueToken(q)
		if other, ok := seen[tok]; ok && other != q {
			t.Fatalf("queues %q and %q share token %q", q, other, tok)
		}
		seen[tok] = q
		// Random strings decode without panicking.
		_, _ = DecodeQueueToken(q)
	}
	if !utf8.ValidString(EncodeQueueToken("\xff")) {
		t.Fatal("token of invalid UTF-8 is not ASCII")
	}
}
