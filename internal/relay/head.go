package relay

import (
	"encoding/json"
	"strings"
)

// readHead reads the id, type and subject of a structured-mode CloudEvent
// without decoding the rest: it walks the top-level object and stops once
// the three are found (our writers put them before data). Anything it does
// not expect goes to encoding/json, so any valid JSON object is read as
// encoding/json reads it (except for repeated names, where the first wins:
// our writers never repeat one).
// The relay reads the head of every record, so this is on its hot path.
func readHead(b []byte) (envelopeHead, error) {
	var h envelopeHead
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return readHeadSlow(b)
	}
	i++
	found := 0
	for {
		i = skipSpace(b, i)
		if i < len(b) && b[i] == '}' {
			return h, nil
		}
		key, next, ok := plainString(b, i)
		if !ok {
			return readHeadSlow(b)
		}
		i = skipSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return readHeadSlow(b)
		}
		i = skipSpace(b, i+1)
		var dst *string
		switch key {
		case "id":
			dst = &h.ID
		case "type":
			dst = &h.Type
		case "subject":
			dst = &h.Subject
		default:
			if strings.EqualFold(key, "id") || strings.EqualFold(key, "type") || strings.EqualFold(key, "subject") {
				return readHeadSlow(b) // encoding/json matches names without case
			}
		}
		if dst != nil {
			v, next, ok := plainString(b, i)
			if !ok {
				return readHeadSlow(b)
			}
			*dst = v
			i = next
			if found++; found == 3 {
				return h, nil
			}
		} else if i, ok = skipValue(b, i); !ok {
			return readHeadSlow(b)
		}
		i = skipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i++
		case i < len(b) && b[i] == '}':
			return h, nil
		default:
			return readHeadSlow(b)
		}
	}
}

func readHeadSlow(b []byte) (envelopeHead, error) {
	var h envelopeHead
	err := json.Unmarshal(b, &h)
	return h, err
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string without escapes at b[i]; ok is false for
// anything else (the caller then decodes the slow way).
func plainString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return "", i, false
		}
	}
	return "", i, false
}

// skipValue skips one JSON value at b[i]: strings (with escapes), objects
// and arrays by depth, scalars up to the next delimiter. It does not
// validate; a malformed record ends in the slow path or in an error there.
func skipValue(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(b) {
				return i, false
			}
			i++
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 {
				return i, true
			}
			depth--
			i++
		case ',':
			if depth == 0 {
				return i, true
			}
			i++
		default:
			i++
		}
		if depth == 0 && i < len(b) && (b[i] == ',' || b[i] == '}') {
			return i, true
		}
	}
	return i, depth == 0
}
