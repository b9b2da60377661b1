// Package redact keeps secrets out of what cronstream prints: the password
// in a URL's userinfo, in every URL of a comma-separated list and in
// query parameters such as a cluster's ?addr= list; and anything a library
// error or log line echoes of a URL or password it was given.
package redact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// unparsable replaces a URL that could not be parsed: where its userinfo
// ends cannot be known, so none of it is shown.
const unparsable = "(unparsable URL, not shown)"

// URL returns raw, one URL or a comma-separated list, with every password
// replaced by Mask. A URL that does not parse is not shown at all, only its
// scheme when it has one.
func URL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = one(p)
	}
	return strings.Join(parts, ",")
}

func one(raw string) string {
	s := strings.TrimSpace(raw)
	if s == "" {
		return raw
	}
	withScheme := s
	if !strings.Contains(s, "://") {
		withScheme = "scheme://" + s // host:port, user:pw@host:port
	}
	u, err := url.Parse(withScheme)
	if err != nil {
		if scheme, _, ok := strings.Cut(s, "://"); ok && validScheme(scheme) {
			return scheme + "://" + unparsable
		}
		return unparsable
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			for i, v := range vs {
				if sensitiveParam(k) {
					vs[i] = Mask
				} else if strings.Contains(v, "@") || strings.Contains(v, "://") {
					vs[i] = one(v) // an address with userinfo
				}
			}
		}
		u.RawQuery = q.Encode()
	}
	out := u.String()
	if withScheme != s {
		out = strings.TrimPrefix(out, "scheme://")
	}
	return out
}

func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// sensitiveParam reports whether a query parameter carries a secret
// (go-redis's sentinel_password, a token, ...).
func sensitiveParam(k string) bool {
	k = strings.ToLower(k)
	for _, w := range []string{"password", "passwd", "pass", "secret", "token", "key", "creds"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// quoted matches a Go-quoted string, as url.Parse's errors quote pieces
// of the URL.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// ParseError is url.Parse's error without the URL and without the pieces
// of it the reason quotes ("invalid port \":secret\" after host"): what was
// wrong, never what was given. Other errors are returned as they are.
func ParseError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) || ue.Op != "parse" {
		return err
	}
	return errors.New(quoted.ReplaceAllString(ue.Err.Error(), `"…"`))
}

// Scrubber removes known secrets from text: the URLs it was given (raw, as
// a library may echo them) and the passwords inside them or given
// separately. Its zero value removes nothing; it is not safe for
// concurrent Add, only for concurrent use once filled.
type Scrubber struct {
	// pairs holds old, new for strings.Replacer, longest first.
	pairs []string
	r     *strings.Replacer
}

// AddURL registers a URL or comma-separated list: the raw text and each of
// its URLs become their redacted form, and their passwords Mask.
func (s *Scrubber) AddURL(raw string) {
	if strings.TrimSpace(raw) == "" {
		return
	}
	s.add(raw, URL(raw))
	for _, p := range strings.Split(raw, ",") {
		p = strings.TrimSpace(p)
		s.add(p, one(p))
		for _, secret := range passwords(p) {
			s.AddSecret(secret)
		}
	}
}

// AddSecret registers a secret (a password from a flag or file) to be
// replaced by Mask, in its raw and URL-escaped forms.
func (s *Scrubber) AddSecret(secret string) {
	if secret == "" {
		return
	}
	s.add(secret, Mask)
	s.add(url.QueryEscape(secret), Mask)
	s.add(url.PathEscape(secret), Mask)
	s.add(url.UserPassword("", secret).String()[1:], Mask)
}

func (s *Scrubber) add(old, repl string) {
	if old == "" || old == repl {
		return
	}
	for i := 0; i < len(s.pairs); i += 2 {
		if s.pairs[i] == old {
			return
		}
	}
	s.pairs = append(s.pairs, old, repl)
	s.r = nil
}

// passwords extracts what may be a password from one URL, even one that
// does not parse: the text between the first ':' after "://" and the last
// '@' of the authority-looking part.
func passwords(raw string) []string {
	var out []string
	withScheme := raw
	if !strings.Contains(raw, "://") {
		withScheme = "scheme://" + raw
	}
	if u, err := url.Parse(withScheme); err == nil {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
		for k, vs := range u.Query() {
			for _, v := range vs {
				if sensitiveParam(k) {
					out = append(out, v)
				} else if strings.Contains(v, "@") {
					out = append(out, passwords(v)...)
				}
			}
		}
		return out
	}
	_, rest, _ := strings.Cut(withScheme, "://")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		userinfo := rest[:at]
		pw := userinfo // redis://secret@host: go-redis reads it as the password
		if _, p, ok := strings.Cut(userinfo, ":"); ok {
			pw = p
		}
		out = append(out, pw)
		if un, err := url.PathUnescape(pw); err == nil {
			out = append(out, un)
		}
		// url.Parse's own errors quote the authority up to the first of
		// these, so a piece of the password may appear alone.
		for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("/?#", r) }) {
			out = append(out, piece)
		}
	}
	return out
}

func (s *Scrubber) replacer() *strings.Replacer {
	if s.r == nil {
		// Longest first: a raw URL goes before the password inside it.
		idx := make([]int, 0, len(s.pairs)/2)
		for i := 0; i < len(s.pairs); i += 2 {
			idx = append(idx, i)
		}
		slices.SortStableFunc(idx, func(a, b int) int { return len(s.pairs[b]) - len(s.pairs[a]) })
		ordered := make([]string, 0, len(s.pairs))
		for _, i := range idx {
			ordered = append(ordered, s.pairs[i], s.pairs[i+1])
		}
		s.r = strings.NewReplacer(ordered...)
	}
	return s.r
}

// Prepare builds the replacer once, so concurrent String calls only read.
func (s *Scrubber) Prepare() *Scrubber {
	if s != nil && len(s.pairs) > 0 {
		s.replacer()
	}
	return s
}

// String returns text without the registered secrets.
func (s *Scrubber) String(text string) string {
	if s == nil || len(s.pairs) == 0 {
		return text
	}
	return s.replacer().Replace(text)
}

// Error returns err with the registered secrets removed from its message;
// errors.Is and errors.As still see the original chain.
func (s *Scrubber) Error(err error) error {
	if err == nil || s == nil || len(s.pairs) == 0 {
		return err
	}
	msg := s.String(err.Error())
	if msg == err.Error() {
		return err
	}
	return &scrubbed{msg: msg, err: err}
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// Handler wraps a slog.Handler so no record it passes on carries a
// registered secret: the message, string and error attributes are scrubbed.
func (s *Scrubber) Handler(h slog.Handler) slog.Handler {
	s.Prepare()
	return &handler{next: h, s: s}
}

type handler struct {
	next slog.Handler
	s    *Scrubber
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.s.String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = h.attr(a)
	}
	return &handler{next: h.next.WithAttrs(clean), s: h.s}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(name), s: h.s}
}

func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.s.String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, x := range g {
			clean[i] = h.attr(x)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.s.String(textOf(err, err.Error)))
		}
		if st, ok := v.Any().(interface{ String() string }); ok {
			return slog.String(a.Key, h.s.String(textOf(st, st.String)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// textOf returns text(), as slog's own handlers print a value whose Error
// or String method panics: "<nil>" for a nil pointer that does not guard
// against nil, "!PANIC: ..." otherwise. A log line never takes the process
// down.
func textOf(v any, text func() string) (s string) {
	defer func() {
		if r := recover(); r != nil {
			if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
				s = "<nil>"
				return
			}
			s = fmt.Sprintf("!PANIC: %v", r)
		}
	}()
	return text()
}
