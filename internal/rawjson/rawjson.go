// Package rawjson writes JSON string literals byte by byte, as a publisher
// that does not go through encoding/json may, for tests of what cronstream
// makes of such input (encoding/json would write U+FFFD for every byte
// that is not UTF-8). It is for tests only; non-test code must not import
// it.
package rawjson

import (
	"fmt"
	"strings"
)

// Literal writes s as a JSON string literal: only '"', '\' and control
// bytes are escaped, every other byte is written as it is. With
// escapeSurrogates, the three-byte encodings of UTF-16 surrogate halves
// (invalid UTF-8 in Go) are written as \uXXXX escapes instead, the form a
// JSON library of another language writes.
func Literal(s string, escapeSurrogates bool) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		case escapeSurrogates && c == 0xed && i+2 < len(s) && s[i+1] >= 0xa0 && s[i+1] <= 0xbf && s[i+2] >= 0x80 && s[i+2] <= 0xbf:
			fmt.Fprintf(&b, `\u%04x`, 0xd000|rune(s[i+1]&0x3f)<<6|rune(s[i+2]&0x3f))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
