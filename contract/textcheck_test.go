package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cronstream/cronstream/internal/rawjson"
)

// placeholder stands for the value under test while the event is encoded;
// encoding/json writes it as "\u0000value\u0000", which rawjson.Literal then
// replaces.
const placeholder = "\x00value\x00"

// rawConfigEvent encodes an updated event of e with the placeholder in it
// replaced by v as written by rawjson.Literal.
func rawConfigEvent(t testing.TB, e Entry, v string, escapeSurrogates bool) []byte {
	t.Helper()
	return withLiteral(t, e, []byte(rawjson.Literal(v, escapeSurrogates)))
}

// withLiteral encodes an updated event of e with the placeholder in it
// replaced by the string literal lit.
func withLiteral(t testing.TB, e Entry, lit []byte) []byte {
	t.Helper()
	ev, err := NewEvent(GatedType(TypeEntryUpdated, e), "raw-publisher", "", e)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ph, _ := json.Marshal(placeholder)
	if bytes.Count(b, ph) != 1 {
		t.Fatalf("placeholder not in %s", b)
	}
	return bytes.Replace(b, ph, lit, 1)
}

// inputCase is one field of an entry set to a value. The same cases feed
// the CLI's view (the Go value, Entry.Validate) and a raw publisher's (the
// bytes on the stream, DecodeConfigEvent).
type inputCase struct {
	field string // the field validation names
	set   func(e *Entry, v string)
}

var inputFields = []inputCase{
	{"id", func(e *Entry, v string) { e.ID = v }},
	{"cron", func(e *Entry, v string) { e.Cron = v }},
	{"timezone", func(e *Entry, v string) { e.Timezone = v }},
	{"task.type", func(e *Entry, v string) { e.Task.Type = v }},
	{"task.headers", func(e *Entry, v string) { e.Task.Headers = map[string]string{v: "x"} }},
	{"task.headers", func(e *Entry, v string) { e.Task.Headers = map[string]string{"h": v} }},
	{"options.queue", func(e *Entry, v string) { e.Options.Queue = v }},
	{"options.group", func(e *Entry, v string) { e.Options.Group = v }},
	{"catchup.policy", func(e *Entry, v string) { e.Catchup.Policy = CatchupPolicy(v) }},
	{"overlap", func(e *Entry, v string) { e.Overlap = OverlapPolicy(v) }},
	{"note", func(e *Entry, v string) { e.Note = v }},
	{"owner", func(e *Entry, v string) { e.Owner = v }},
	{"exclude", func(e *Entry, v string) { e.Exclude = []string{v} }},
	{"labels", func(e *Entry, v string) { e.Labels = map[string]string{v: "x"} }},
	{"labels.k", func(e *Entry, v string) { e.Labels = map[string]string{"k": v} }},
}

// TestRawPublishSameVerdictAsValidate: text that is not UTF-8 (stray
// bytes, a truncated sequence, half a surrogate pair written as bytes or as
// a \u escape) in any string field of an entry is refused by validation of
// the Go value and by the decoder of the bytes alike, naming the same
// field; encoding/json would have repaired the bytes to U+FFFD. U+FFFD
// itself, and a surrogate pair, are text like any other.
func TestRawPublishSameVerdictAsValidate(t *testing.T) {
	bad := map[string]string{
		"stray byte":     "q\xff",
		"truncated":      "q\xc3",
		"surrogate half": "q\xed\xa0\x80",
		"low half":       "q\xed\xb0\x80",
		"overlong":       "q\xc0\xaf",
	}
	for _, f := range inputFields {
		for name, v := range bad {
			for _, escaped := range []bool{false, true} {
				if escaped && !strings.Contains(name, "half") {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/escaped=%t", f.field, name, escaped), func(t *testing.T) {
					goValue := validEntry("j")
					f.set(&goValue, v)
					verr := goValue.Validate()
					if !slices.Contains(fieldsOf(verr), f.field) {
						t.Fatalf("Validate: %v, want field %s named", verr, f.field)
					}
					withPH := validEntry("j")
					f.set(&withPH, placeholder)
					raw := rawConfigEvent(t, withPH, v, escaped)
					_, _, derr := DecodeConfigEvent(raw)
					if !errors.Is(derr, ErrMalformedEvent) || !slices.Contains(fieldsOf(derr), f.field) {
						t.Fatalf("DecodeConfigEvent: %v, want field %s named\n%q", derr, f.field, raw)
					}
					if _, fast := decodeConfigFast(raw, new(Entry)); fast {
						t.Fatal("the fast path took text it must leave to encoding/json")
					}
				})
			}
		}
	}
	// What is valid text stays valid on both paths, U+FFFD included.
	for _, v := range []string{"q\ufffd", "q😀", "日本"} {
		e := validEntry("j")
		e.Options.Queue = v
		if err := e.Validate(); err != nil {
			t.Fatalf("Validate(%q): %v", v, err)
		}
		withPH := validEntry("j")
		withPH.Options.Queue = placeholder
		for _, raw := range [][]byte{rawConfigEvent(t, withPH, v, false), withLiteral(t, withPH, asciiJSON(t, v))} {
			_, got, err := DecodeConfigEvent(raw)
			if err != nil || got.Options.Queue != v {
				t.Fatalf("%q: decoded %v, %v", raw, got, err)
			}
		}
	}
}

// asciiJSON encodes v with every non-ASCII rune as a \u escape (a pair
// for runes beyond the BMP), as some JSON libraries write.
func asciiJSON(t *testing.T, v string) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, r := range string(b) {
		switch {
		case r < utf8.RuneSelf:
			out.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(&out, `\u%04x`, r)
		}
	}
	return out.Bytes()
}

// TestRawPublishOtherChecksSameVerdict: the checks that are not about text
// (sizes, ids, enums) are Entry.Validate's on both paths.
func TestRawPublishOtherChecksSameVerdict(t *testing.T) {
	headers := map[string]string{}
	for i := range maxHeaders + 1 {
		headers[fmt.Sprint("h", i)] = "v"
	}
	for _, c := range []struct {
		field string
		edit  func(e *Entry)
	}{
		{"note", func(e *Entry) { e.Note = strings.Repeat("n", maxNoteLen+1) }},
		{"owner", func(e *Entry) { e.Owner = strings.Repeat("o", maxOwnerLen+1) }},
		{"options.queue", func(e *Entry) { e.Options.Queue = strings.Repeat("q", maxQueueLen+1) }},
		{"options.queue", func(e *Entry) { e.Options.Queue = "}q" }},
		{"task.headers", func(e *Entry) { e.Task.Headers = headers }},
		{"task.payload", func(e *Entry) { e.Task.Payload = make([]byte, MaxPayloadBytes+1) }},
		{"id", func(e *Entry) { e.ID = strings.Repeat("i", maxIDLen+1) }},
		{"id", func(e *Entry) { e.ID = "a~b" }},
		{"task.type", func(e *Entry) { e.Task.Type = " " }},
		{"options.max_retry", func(e *Entry) { r := -1; e.Options.MaxRetry = &r }},
		{"jitter", func(e *Entry) { e.Jitter = Duration(25 * 3600e9) }},
	} {
		t.Run(c.field, func(t *testing.T) {
			e := validEntry("j")
			c.edit(&e)
			verr := e.Validate()
			if !slices.Contains(fieldsOf(verr), c.field) {
				t.Fatalf("Validate: %v, want %s", verr, c.field)
			}
			ev, err := NewEvent(TypeEntryUpdated, "raw-publisher", e.ID, e)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := ev.Marshal()
			_, _, derr := DecodeConfigEvent(raw)
			if !slices.Equal(fieldsOf(derr), fieldsOf(verr)) {
				t.Fatalf("DecodeConfigEvent names %v, Validate %v", fieldsOf(derr), fieldsOf(verr))
			}
		})
	}
}

// TestRepairedEnvelopeRefused: the envelope's text is judged as written too.
func TestRepairedEnvelopeRefused(t *testing.T) {
	const good = `{"specversion":"1.0","id":"a","source":"s","type":"cronstream.entry.updated","subject":"j","time":"2026-01-02T03:04:05Z","data":{"id":"j","cron":"@every 1s","task":{"type":"t"}}}`
	if _, _, err := DecodeConfigEvent([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for member, in := range map[string]string{
		"source":  strings.Replace(good, `"source":"s"`, "\"source\":\"s\xff\"", 1),
		"id":      strings.Replace(good, `"id":"a"`, `"id":"a\udfff"`, 1),
		"unknown": strings.Replace(good, `"source":"s"`, "\"source\":\"s\",\"x\xfe\":1", 1),
	} {
		ev, _, err := DecodeConfigEvent([]byte(in))
		if !errors.Is(err, ErrMalformedEvent) || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("%s: %v, want refused for its text", member, err)
		}
		if ev == nil {
			t.Errorf("%s: the envelope must still be returned, for audit to show", member)
		}
	}
}

func TestRepairedAt(t *testing.T) {
	for in, want := range map[string]int{
		`"abc"`:                    -1,
		`"\ud83d\ude00"`:           -1,
		`"\uD83D\uDE00"`:           -1,
		`"\ufffd"`:                 -1,
		"\"\xef\xbf\xbd\"":         -1,
		`"\\ud800"`:                -1, // an escaped backslash, then text
		`"\\\ud800"`:               3,
		`"\ud800"`:                 1,
		`"\udc00\ud800"`:           1,
		`"\ud800\ud800\udc00"`:     1,
		`"\ud83d x"`:               1,
		`"\ud83d\u0041"`:           1,
		"\"a\xff\"":                2,
		"\"ab\xe2\x82\"":           3,
		`{"k":"v","\ud800":1}`:     10,
		"{\"k\":[\"x\",\"\x80\"]}": 11,
	} {
		if got := repairedAt([]byte(in)); got != want {
			t.Errorf("repairedAt(%q) = %d, want %d", in, got, want)
		}
	}
}

// noRepair fails t when a config event DecodeConfigEvent accepted decodes
// to a U+FFFD that b does not hold (as the character or its escape): then
// encoding/json replaced something the publisher wrote.
func noRepair(t *testing.T, b []byte, ev *Event, e *Entry) {
	t.Helper()
	if bytes.Contains(b, []byte("\ufffd")) || bytes.Contains(bytes.ToLower(b), []byte(`\ufffd`)) {
		return
	}
	for _, v := range []any{ev, e} {
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out, []byte("\ufffd")) || bytes.Contains(out, []byte(`\ufffd`)) {
			t.Fatalf("accepted text encoding/json repaired: %q decodes to %s", b, out)
		}
	}
}
