package console

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// TestSessionValues: a session value is not the token and holds nothing of
// it; every replica with the same token accepts it, one with another token
// (the token rotated) does not; a value changed in any byte, expired, from
// the future or issued under a longer TTL than the checker's is refused.
func TestSessionValues(t *testing.T) {
	const token = "s3cret-token-of-the-deployment"
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mk := func(tok string, ttl time.Duration) *sessions {
		s, err := newSessions(tok, ttl, clock)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := mk(token, time.Hour), mk(token, time.Hour)
	v, exp := a.issue()
	if !exp.Equal(now.Add(time.Hour)) {
		t.Errorf("expiry %s, want %s", exp, now.Add(time.Hour))
	}
	for _, leak := range []string{token, base64.RawURLEncoding.EncodeToString([]byte(token)), base64.StdEncoding.EncodeToString([]byte(token))} {
		if strings.Contains(v, leak) {
			t.Fatalf("session value %q holds the token (%q)", v, leak)
		}
	}
	if err := a.check(v); err != nil {
		t.Fatalf("own session refused: %v", err)
	}
	if err := b.check(v); err != nil {
		t.Fatalf("another replica with the same token refused it: %v", err)
	}
	if w, _ := a.issue(); w == v {
		t.Error("two sessions got the same value")
	}
	if err := mk(token+"-rotated", time.Hour).check(v); err == nil {
		t.Error("a replica with another token accepted the session")
	}
	if err := mk(token, time.Minute).check(v); err == nil {
		t.Error("a replica with a shorter TTL accepted a session lasting longer")
	}
	raw, _ := base64.RawURLEncoding.DecodeString(v)
	for i := range raw {
		forged := append([]byte(nil), raw...)
		forged[i] ^= 0x01
		if err := a.check(base64.RawURLEncoding.EncodeToString(forged)); err == nil {
			t.Fatalf("a value with byte %d changed was accepted", i)
		}
	}
	for _, junk := range []string{"", token, "!!", v + "A", v[:len(v)-2]} {
		if err := a.check(junk); err == nil {
			t.Errorf("%q accepted", junk)
		}
	}
	now = exp.Add(-time.Second)
	if err := a.check(v); err != nil {
		t.Errorf("refused a second before it expires: %v", err)
	}
	now = exp
	if err := a.check(v); err == nil {
		t.Error("accepted once expired")
	}
}

func TestLocalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/entries?id=a":         "/entries?id=a",
		"":                      "/",
		"//evil.example/x":      "/",
		"/\\evil.example":       "/",
		"https://evil.example/": "/",
		"entries":               "/",
		"/a\r\nSet-Cookie: x":   "/",
	} {
		if got := localPath(in); got != want {
			t.Errorf("localPath(%q) = %q, want %q", in, got, want)
		}
	}
}
