package contract

import (
	"encoding/base64"
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"unicode/utf8"
)

// A projection decodes one config event per entry at start, and
// encoding/json pays for reflection, a second pass over the data and a copy
// of it on each. decodeConfigFast reads the form cronstream itself writes
// in one pass, several times faster (BenchmarkDecodeConfigEvent; figures in
// docs/benchmarks.md).
//
// It is an accelerator, never a second definition of the format: it accepts
// only a strict subset of JSON on which its result is provably the one
// encoding/json gives — every key spelled exactly as the contract (no
// case-folded match), each key at most once, strings without escapes and in
// valid UTF-8, integers without fraction or exponent, no null, no unknown
// key — and says "not mine" (ok false) on anything else, including every
// error. DecodeConfigEvent then decodes the same bytes with encoding/json,
// which decides and words every error, and refuses what encoding/json would
// repair (textcheck.go): text the subset never holds. FuzzDecodeConfigFast
// checks the claim against encoding/json.

// fastScanner walks one JSON document.
type fastScanner struct {
	b []byte
	i int
}

func (s *fastScanner) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte without consuming it (0 at the end).
func (s *fastScanner) peek() byte {
	s.skipSpace()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// consume eats the next non-space byte if it is c.
func (s *fastScanner) consume(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// str reads a string and returns its contents (aliasing the input) and the
// whole literal with its quotes. Escapes, control characters and invalid
// UTF-8 are outside the subset.
func (s *fastScanner) str() (content, literal []byte, ok bool) {
	if !s.consume('"') {
		return nil, nil, false
	}
	start := s.i
	ascii := true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			content = s.b[start:s.i]
			s.i++
			if !ascii && !utf8.Valid(content) {
				return nil, nil, false
			}
			return content, s.b[start-1 : s.i], true
		case c == '\\' || c < 0x20:
			return nil, nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		s.i++
	}
	return nil, nil, false
}

func (s *fastScanner) string() (string, bool) {
	c, _, ok := s.str()
	return string(c), ok
}

// shared is string for a value many events repeat (an event type, a zone,
// a queue, a cron spec, a header): it comes from recurring, so a projection
// of many entries holds one copy of it instead of one per entry.
func (s *fastScanner) shared() (string, bool) {
	c, _, ok := s.str()
	return recurring.get(c), ok
}

// recurringSlots bounds the table; maxRecurringLen keeps long text (which
// rarely recurs) out of it.
const (
	recurringSlots  = 4096
	maxRecurringLen = 64
)

// recurringStrings is a lossy table of strings seen before: a slot holds the
// last string hashed to it. Decoders on several goroutines share it without
// a lock; a slot swapped under a reader only costs that reader a new copy.
type recurringStrings struct {
	seed  maphash.Seed
	slots [recurringSlots]atomic.Pointer[string]
}

var recurring = &recurringStrings{seed: maphash.MakeSeed()}

func (t *recurringStrings) get(b []byte) string {
	if len(b) == 0 || len(b) > maxRecurringLen {
		return string(b)
	}
	slot := &t.slots[maphash.Bytes(t.seed, b)%recurringSlots]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	v := string(b)
	slot.Store(&v)
	return v
}

func (s *fastScanner) boolean() (v, ok bool) {
	s.skipSpace()
	rest := s.b[s.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		s.i += 4
		return true, s.delimited()
	case len(rest) >= 5 && string(rest[:5]) == "false":
		s.i += 5
		return false, s.delimited()
	}
	return false, false
}

// delimited reports whether a literal just read ends where JSON says a value
// ends, so "truex" or "12a" are left to encoding/json to refuse.
func (s *fastScanner) delimited() bool {
	if s.i >= len(s.b) {
		return true
	}
	switch s.b[s.i] {
	case ' ', '\t', '\n', '\r', ',', '}', ']':
		return true
	}
	return false
}

// integer reads -?(0|[1-9][0-9]*) that fits an int.
func (s *fastScanner) integer() (int, bool) {
	s.skipSpace()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n := s.i - digits
	if n == 0 || (n > 1 && s.b[digits] == '0') || !s.delimited() {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 0)
	return int(v), err == nil
}

func (s *fastScanner) duration() (Duration, bool) {
	c, _, ok := s.str()
	if !ok {
		return 0, false
	}
	d, err := ParseDuration(string(c))
	return d, err == nil
}

// member moves to the i-th member of an object whose '{' was consumed and
// reads its key and colon; done is true at the closing '}'.
func (s *fastScanner) member(i int) (key []byte, done, ok bool) {
	if s.consume('}') {
		return nil, true, true
	}
	if i > 0 && !s.consume(',') {
		return nil, false, false
	}
	key, _, ok = s.str()
	return key, false, ok && s.consume(':')
}

// once marks bit as seen and reports whether it was new.
func once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// object reads an object into v: field reads the value of one member (the
// scanner stands at it) and returns the member's bit, each allowed once,
// and whether it could (false for an unknown key). field is a plain
// function, so no closure is allocated per object.
func object[T any](s *fastScanner, v *T, field func(*fastScanner, *T, []byte) (uint32, bool)) bool {
	if !s.consume('{') {
		return false
	}
	var seen uint32
	for i := 0; ; i++ {
		key, done, ok := s.member(i)
		if !ok {
			return false
		}
		if done {
			return true
		}
		bit, ok := field(s, v, key)
		if !ok || !once(&seen, bit) {
			return false
		}
	}
}

// configEvent is what decodeConfigFast fills: the envelope beside the
// scanner (one allocation for both) and the caller's entry.
type configEvent struct {
	s  fastScanner
	ev Event
	e  *Entry
}

// decodeConfigFast decodes a config event envelope and its entry data into
// e, which must be zero. ok false means only that the input is outside the
// subset (e may then hold part of it); it says nothing about validity.
// ev.Data aliases b.
func decodeConfigFast(b []byte, e *Entry) (ev *Event, ok bool) {
	c := &configEvent{s: fastScanner{b: b}, e: e}
	s := &c.s
	if !object(s, c, envelopeField) {
		return nil, false
	}
	s.skipSpace()
	if s.i != len(s.b) || c.ev.Data == nil {
		return nil, false
	}
	return &c.ev, true
}

func envelopeField(s *fastScanner, c *configEvent, key []byte) (bit uint32, ok bool) {
	ev := &c.ev
	switch string(key) {
	case "specversion":
		ev.SpecVersion, ok = s.shared()
		return 1 << 0, ok
	case "id":
		ev.ID, ok = s.string()
		return 1 << 1, ok
	case "source":
		ev.Source, ok = s.shared()
		return 1 << 2, ok
	case "type":
		ev.Type, ok = s.shared()
		return 1 << 3, ok
	case "subject":
		ev.Subject, ok = s.string()
		return 1 << 4, ok
	case "time":
		// time.Time decodes itself from the quoted literal, exactly as
		// encoding/json hands it over.
		_, lit, ok := s.str()
		return 1 << 5, ok && ev.Time.UnmarshalJSON(lit) == nil
	case "datacontenttype":
		ev.DataContentType, ok = s.shared()
		return 1 << 6, ok
	case "data":
		s.skipSpace()
		start := s.i
		ok = object(s, c.e, entryField)
		ev.Data = s.b[start:s.i:s.i]
		return 1 << 7, ok
	}
	return 0, false
}

func entryField(s *fastScanner, e *Entry, key []byte) (bit uint32, ok bool) {
	switch string(key) {
	case "id":
		e.ID, ok = s.string()
		return 1 << 0, ok
	case "cron":
		e.Cron, ok = s.shared()
		return 1 << 1, ok
	case "timezone":
		e.Timezone, ok = s.shared()
		return 1 << 2, ok
	case "task":
		return 1 << 3, object(s, &e.Task, taskField)
	case "options":
		return 1 << 4, object(s, &e.Options, optionsField)
	case "catchup":
		return 1 << 5, object(s, &e.Catchup, catchupField)
	case "overlap":
		var v string
		v, ok = s.shared()
		e.Overlap = OverlapPolicy(v)
		return 1 << 6, ok
	case "jitter":
		e.Jitter, ok = s.duration()
		return 1 << 7, ok
	case "paused":
		e.Paused, ok = s.boolean()
		return 1 << 8, ok
	case "note":
		e.Note, ok = s.string()
		return 1 << 9, ok
	case "owner":
		e.Owner, ok = s.shared()
		return 1 << 10, ok
	case "removed":
		e.Removed, ok = s.boolean()
		return 1 << 11, ok
	case "pause_on_failure":
		e.PauseOnFailure, ok = s.boolean()
		return 1 << 12, ok
	}
	return 0, false
}

func taskField(s *fastScanner, t *Task, key []byte) (bit uint32, ok bool) {
	switch string(key) {
	case "type":
		t.Type, ok = s.shared()
		return 1 << 0, ok
	case "payload":
		var c []byte
		if c, _, ok = s.str(); ok {
			// encoding/json's own way: StdEncoding into DecodedLen bytes.
			p := make([]byte, base64.StdEncoding.DecodedLen(len(c)))
			n, err := base64.StdEncoding.Decode(p, c)
			t.Payload, ok = p[:n], err == nil
		}
		return 1 << 1, ok
	case "headers":
		return 1 << 2, s.headers(t)
	}
	return 0, false
}

// headers reads a string-to-string object; a repeated name's last value
// wins, as in encoding/json.
func (s *fastScanner) headers(t *Task) bool {
	if !s.consume('{') {
		return false
	}
	t.Headers = make(map[string]string)
	for i := 0; ; i++ {
		key, done, ok := s.member(i)
		if !ok {
			return false
		}
		if done {
			return true
		}
		v, ok := s.shared()
		if !ok {
			return false
		}
		t.Headers[recurring.get(key)] = v
	}
}

func optionsField(s *fastScanner, o *Options, key []byte) (bit uint32, ok bool) {
	switch string(key) {
	case "queue":
		o.Queue, ok = s.shared()
		return 1 << 0, ok
	case "max_retry":
		var r int
		r, ok = s.integer()
		o.MaxRetry = &r
		return 1 << 1, ok
	case "timeout":
		o.Timeout, ok = s.duration()
		return 1 << 2, ok
	case "deadline":
		o.Deadline, ok = s.duration()
		return 1 << 3, ok
	case "unique":
		o.Unique, ok = s.duration()
		return 1 << 4, ok
	case "retention":
		o.Retention, ok = s.duration()
		return 1 << 5, ok
	case "group":
		o.Group, ok = s.shared()
		return 1 << 6, ok
	}
	return 0, false
}

func catchupField(s *fastScanner, c *Catchup, key []byte) (bit uint32, ok bool) {
	switch string(key) {
	case "policy":
		var v string
		v, ok = s.shared()
		c.Policy = CatchupPolicy(v)
		return 1 << 0, ok
	case "window":
		c.Window, ok = s.duration()
		return 1 << 1, ok
	}
	return 0, false
}
