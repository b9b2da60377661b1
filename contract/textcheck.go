package contract

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// encoding/json never refuses a string for its encoding: bytes that are not
// UTF-8, and a \u escape of half a surrogate pair, decode as U+FFFD. The
// decoded entry is then valid and not what the publisher wrote: a raw
// publish of queue "q\xff" would fire into queue "q\ufffd", while the CLI,
// which validates its Go values before they are encoded, refuses the same
// queue. So a config event is judged as written: DecodeConfigEvent refuses
// text that encoding/json would repair (INV-fail-closed), and only then does
// the entry meet Entry.Validate, the one validation every publisher's entry
// goes through. The fast decoder never takes such text (it refuses invalid
// UTF-8 and every escape), so both paths reach the same verdict.

// checkAsWritten refuses a config event whose text encoding/json would
// repair. fast says the fast decoder took b, which it never does then.
func checkAsWritten(ev *Event, b []byte, fast bool) error {
	if fast {
		return nil
	}
	if off := repairedAt(b); off >= 0 {
		return repairedError(ev, b, off)
	}
	return nil
}

// CheckSource checks the event source a Client publishes under
// (WithSource): encoding/json would write U+FFFD for bytes that are not
// UTF-8, publishing another source than the one given.
func CheckSource(source string) error {
	if !utf8.ValidString(source) || len(source) > maxSourceLen {
		return fmt.Errorf("source %q (WithSource) must be valid UTF-8 of at most %d bytes", shorten(source), maxSourceLen)
	}
	return nil
}

// repairedAt returns the offset in the JSON text b of the first string
// content encoding/json would replace with U+FFFD, or -1 when there is
// none. b must be syntactically valid JSON (checked by a decode before):
// then every backslash starts an escape inside a string, and bytes of 0x80
// and above occur only inside strings.
func repairedAt(b []byte) int {
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '\\' && i+1 < len(b) && b[i+1] == 'u':
			r, ok := hex4(b[i+2:])
			if !ok || !utf16.IsSurrogate(r) {
				i += 6
				continue
			}
			// A high half directly followed by a low half is one rune.
			if r < 0xdc00 && i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if r2, ok := hex4(b[i+8:]); ok && r2 >= 0xdc00 && r2 < 0xe000 {
					i += 12
					continue
				}
			}
			return i
		case c == '\\':
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i
			}
			i += n
		}
	}
	return -1
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(v), err == nil
}

// repairedError says where the config event b holds text encoding/json
// would repair (at offset off, from repairedAt): a *FieldError naming the
// entry field as validation does, or the envelope member.
func repairedError(ev *Event, b []byte, off int) error {
	reason := "must be valid UTF-8"
	if b[off] == '\\' {
		reason = fmt.Sprintf("must be valid UTF-8 (%s is half of a UTF-16 surrogate pair, no character)", b[off:off+6])
	}
	path, key, lit := jsonPathAt(b, off)
	if len(path) > 0 && path[0] == "data" {
		fe := &FieldError{Field: fieldAtPath(path[1:], key), Value: excerpt(lit, off), Reason: reason}
		return fmt.Errorf("%w: %s event %s: %w", ErrMalformedEvent, ev.Type, ev.ID, fe)
	}
	return fmt.Errorf("%w: %s event %s: %s %q: %s", ErrMalformedEvent, ev.Type, ev.ID, cmp.Or(strings.Join(path, "."), "text"), excerpt(lit, off), reason)
}

// fieldAtPath names the entry field at path (inside data; key when the
// last element is a member's name) as validation does: a header's name or
// value and a label's name are their map's field, a label's value is
// "labels.<name>", an exclusion is "exclude".
func fieldAtPath(path []string, key bool) string {
	switch {
	case len(path) == 0:
		return "entry"
	case len(path) >= 2 && path[0] == "task" && path[1] == "headers":
		return "task.headers"
	case path[0] == "labels" && len(path) == 2 && !key:
		return "labels." + shorten(path[1])
	case path[0] == "labels":
		return "labels"
	case path[0] == "exclude":
		return "exclude"
	}
	return strings.Join(path, ".")
}

// literal is a string literal of the JSON text: its raw content and where
// that content starts.
type literal struct {
	text  string
	start int
}

// excerpt is the literal's raw content around offset off: all of it when
// short, else 24 bytes on either side, so the bad bytes stay in view.
func excerpt(l literal, off int) string {
	const side = 24
	at := off - l.start
	if len(l.text) <= 2*side+8 || at < 0 || at > len(l.text) {
		return l.text
	}
	from, to := max(at-side, 0), min(at+side, len(l.text))
	s := l.text[from:to]
	if from > 0 {
		s = "…" + s
	}
	if to < len(l.text) {
		s += "…"
	}
	return s
}

// jsonPathAt returns the member names (array indexes as numbers) leading to
// the string token of the valid JSON text b that holds offset off, whether
// that token is a member's name (then it ends the path), and the raw
// literal.
func jsonPathAt(b []byte, off int) (path []string, key bool, lit literal) {
	type frame struct {
		object  bool
		wantKey bool
		name    string
		index   int
	}
	var stack []frame
	pathOf := func() []string {
		var p []string
		for _, f := range stack {
			if f.object {
				p = append(p, f.name)
			} else {
				p = append(p, strconv.Itoa(f.index))
			}
		}
		return p
	}
	// valueDone moves the innermost container past a value.
	valueDone := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].object {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].index++
			}
		}
	}
	d := json.NewDecoder(bytes.NewReader(b))
	for {
		start := int(d.InputOffset())
		tok, err := d.Token()
		if err != nil {
			return nil, false, literal{}
		}
		end := int(d.InputOffset())
		top := len(stack) - 1
		if off >= start && off < end {
			l := rawLiteral(b, start, end)
			if top >= 0 && stack[top].object && stack[top].wantKey {
				p := pathOf()
				return append(p[:len(p)-1], l.text), true, l
			}
			return pathOf(), false, l
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				stack = append(stack, frame{object: tok == '{', wantKey: tok == '{'})
			default:
				stack = stack[:top]
				valueDone()
			}
		case string:
			if top >= 0 && stack[top].object && stack[top].wantKey {
				stack[top].name, stack[top].wantKey = tok, false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

// rawLiteral finds the string literal between start and end (a token's
// span, which may begin with separators) and returns its raw content.
func rawLiteral(b []byte, start, end int) literal {
	q := bytes.IndexByte(b[start:end], '"')
	if q < 0 || end-start-q < 2 {
		return literal{}
	}
	from := start + q + 1
	return literal{text: string(b[from : end-1]), start: from}
}
