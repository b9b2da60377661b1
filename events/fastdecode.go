package events

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"
)

// A projection of 100,000 entries decodes 100,000 config events at start,
// and encoding/json spends about 9 µs on each (reflection, a second pass over
// the data, a copy of it). decodeConfigFast reads the form cronstream itself
// writes in one pass in about a tenth of that.
//
// It is an accelerator, never a second definition of the format: it accepts
// only a strict subset of JSON on which its result is provably the one
// encoding/json gives — every key spelled exactly as the contract (no
// case-folded match), each key at most once, strings without escapes and in
// valid UTF-8, integers without fraction or exponent, no null, no unknown
// key — and says "not mine" (ok false) on anything else, including every
// error. DecodeConfigEvent then decodes the same bytes with encoding/json,
// which decides and words every error. FuzzDecodeConfigFast checks the
// claim against encoding/json.

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

// decodeConfigFast decodes a config event envelope and its entry data. ok
// false means only that the input is outside the subset; it says nothing
// about validity. ev.Data aliases b.
func decodeConfigFast(b []byte) (ev *Event, e *Entry, ok bool) {
	s := fastScanner{b: b}
	ev, e = new(Event), new(Entry)
	if !s.consume('{') {
		return nil, nil, false
	}
	var seen uint32
	for i := 0; ; i++ {
		key, done, ok := s.member(i)
		if !ok {
			return nil, nil, false
		}
		if done {
			break
		}
		var bit uint32
		switch string(key) {
		case "specversion":
			bit = 1 << 0
			ev.SpecVersion, ok = s.string()
		case "id":
			bit = 1 << 1
			ev.ID, ok = s.string()
		case "source":
			bit = 1 << 2
			ev.Source, ok = s.string()
		case "type":
			bit = 1 << 3
			ev.Type, ok = s.string()
		case "subject":
			bit = 1 << 4
			ev.Subject, ok = s.string()
		case "time":
			bit = 1 << 5
			var lit []byte
			// time.Time decodes itself from the quoted literal, exactly
			// as encoding/json hands it over.
			_, lit, ok = s.str()
			ok = ok && ev.Time.UnmarshalJSON(lit) == nil
		case "datacontenttype":
			bit = 1 << 6
			ev.DataContentType, ok = s.string()
		case "data":
			bit = 1 << 7
			s.skipSpace()
			start := s.i
			ok = s.entry(e)
			ev.Data = b[start:s.i:s.i]
		default:
			return nil, nil, false
		}
		if !ok || !once(&seen, bit) {
			return nil, nil, false
		}
	}
	s.skipSpace()
	if s.i != len(s.b) || seen&(1<<7) == 0 {
		return nil, nil, false
	}
	return ev, e, true
}

func (s *fastScanner) entry(e *Entry) bool {
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
		var bit uint32
		switch string(key) {
		case "id":
			bit = 1 << 0
			e.ID, ok = s.string()
		case "cron":
			bit = 1 << 1
			e.Cron, ok = s.string()
		case "timezone":
			bit = 1 << 2
			e.Timezone, ok = s.string()
		case "task":
			bit = 1 << 3
			ok = s.task(&e.Task)
		case "options":
			bit = 1 << 4
			ok = s.options(&e.Options)
		case "catchup":
			bit = 1 << 5
			ok = s.catchup(&e.Catchup)
		case "overlap":
			bit = 1 << 6
			var v string
			v, ok = s.string()
			e.Overlap = OverlapPolicy(v)
		case "jitter":
			bit = 1 << 7
			e.Jitter, ok = s.duration()
		case "paused":
			bit = 1 << 8
			e.Paused, ok = s.boolean()
		case "note":
			bit = 1 << 9
			e.Note, ok = s.string()
		case "owner":
			bit = 1 << 10
			e.Owner, ok = s.string()
		case "removed":
			bit = 1 << 11
			e.Removed, ok = s.boolean()
		default:
			return false
		}
		if !ok || !once(&seen, bit) {
			return false
		}
	}
}

func (s *fastScanner) task(t *Task) bool {
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
		var bit uint32
		switch string(key) {
		case "type":
			bit = 1 << 0
			t.Type, ok = s.string()
		case "payload":
			bit = 1 << 1
			var c []byte
			if c, _, ok = s.str(); ok {
				// encoding/json's own way: StdEncoding into DecodedLen bytes.
				p := make([]byte, base64.StdEncoding.DecodedLen(len(c)))
				n, err := base64.StdEncoding.Decode(p, c)
				t.Payload, ok = p[:n], err == nil
			}
		case "headers":
			bit = 1 << 2
			ok = s.headers(t)
		default:
			return false
		}
		if !ok || !once(&seen, bit) {
			return false
		}
	}
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
		v, ok := s.string()
		if !ok {
			return false
		}
		t.Headers[string(key)] = v
	}
}

func (s *fastScanner) options(o *Options) bool {
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
		var bit uint32
		switch string(key) {
		case "queue":
			bit = 1 << 0
			o.Queue, ok = s.string()
		case "max_retry":
			bit = 1 << 1
			var r int
			r, ok = s.integer()
			o.MaxRetry = &r
		case "timeout":
			bit = 1 << 2
			o.Timeout, ok = s.duration()
		case "deadline":
			bit = 1 << 3
			o.Deadline, ok = s.duration()
		case "unique":
			bit = 1 << 4
			o.Unique, ok = s.duration()
		case "retention":
			bit = 1 << 5
			o.Retention, ok = s.duration()
		case "group":
			bit = 1 << 6
			o.Group, ok = s.string()
		default:
			return false
		}
		if !ok || !once(&seen, bit) {
			return false
		}
	}
}

func (s *fastScanner) catchup(c *Catchup) bool {
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
		var bit uint32
		switch string(key) {
		case "policy":
			bit = 1 << 0
			var v string
			v, ok = s.string()
			c.Policy = CatchupPolicy(v)
		case "window":
			bit = 1 << 1
			c.Window, ok = s.duration()
		default:
			return false
		}
		if !ok || !once(&seen, bit) {
			return false
		}
	}
}
