package console

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Signing in exchanges the token for a session cookie that is not the
// token: an expiry and a random nonce, and an HMAC-SHA256 of both under a
// key derived from the token (HKDF with a label of its own, so the key
// serves nothing else). Every replica given the same token derives the same
// key and accepts the sessions of the others without sharing any state;
// changing the token ends every session. A stolen cookie is worth a session
// until it expires, never the token.
const (
	sessionCookie = "cronstream_session"
	// legacyTokenCookie held the token itself before sessions.
	legacyTokenCookie = "cronstream_console"
	sessionLabel      = "cronstream console session v1"
	// DefaultSessionTTL is how long a session lasts unless
	// Config.SessionTTL says otherwise.
	DefaultSessionTTL = 12 * time.Hour
	nonceLen          = 16
	sessionLen        = 1 + 8 + nonceLen + sha256.Size // version, expiry, nonce, MAC
	sessionVersion    = 1
	// clockSkew is how far a replica that issued a session may run ahead
	// of the one checking it.
	clockSkew = time.Minute
)

// sessions issues and checks session cookies for one token.
type sessions struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

func newSessions(token string, ttl time.Duration, now func() time.Time) (*sessions, error) {
	key, err := hkdf.Key(sha256.New, []byte(token), nil, sessionLabel, sha256.Size)
	if err != nil {
		return nil, err
	}
	return &sessions{key: key, ttl: ttl, now: now}, nil
}

// issue returns a new session value and when it expires.
func (s *sessions) issue() (string, time.Time) {
	exp := s.now().Add(s.ttl).Truncate(time.Second)
	b := make([]byte, sessionLen)
	b[0] = sessionVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(exp.Unix()))
	// crypto/rand.Read never fails (Go 1.24+: it aborts the process).
	_, _ = rand.Read(b[9 : 9+nonceLen])
	copy(b[9+nonceLen:], s.mac(b[:9+nonceLen]))
	return base64.RawURLEncoding.EncodeToString(b), exp
}

func (s *sessions) mac(body []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write(body)
	return m.Sum(nil)
}

// errSession is why a session value is refused.
var errSession = errors.New("no valid session")

// check accepts a value issue made under the same token that has not
// expired, and whose expiry lies no further ahead than a session lasts
// (so shortening the TTL shortens the sessions already issued).
func (s *sessions) check(v string) error {
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) != sessionLen || b[0] != sessionVersion {
		return errSession
	}
	body := b[:9+nonceLen]
	if !hmac.Equal(b[9+nonceLen:], s.mac(body)) {
		return errSession
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(b[1:9])), 0)
	now := s.now()
	if !now.Before(exp) || exp.Sub(now) > s.ttl+clockSkew {
		return errSession
	}
	return nil
}

// authorized reports whether r carries the token as a bearer, or a valid
// session cookie.
func (c *Console) authorized(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && c.tokenMatches(tok) {
		return true
	}
	return c.signedIn(r)
}

// signedIn reports whether r carries a valid session cookie.
func (c *Console) signedIn(r *http.Request) bool {
	ck, err := r.Cookie(sessionCookie)
	return err == nil && c.sessions != nil && c.sessions.check(ck.Value) == nil
}

func (c *Console) tokenMatches(s string) bool {
	return subtle.ConstantTimeCompare([]byte(s), []byte(c.cfg.Token)) == 1
}

// maxFormBytes bounds the sign-in form's body.
const maxFormBytes = 4 << 10

// login serves the sign-in form (GET) and signs in (POST, the token in the
// form's body): a session cookie, then back to the page asked for. A token
// in the address is refused, never used: addresses end up in histories,
// logs and Referer headers.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if r.Method != http.MethodPost {
		p := page{Title: "Sign in", Data: localPath(r.URL.Query().Get("next"))}
		code := http.StatusOK
		if r.URL.Query().Has("token") {
			code, p.Error = http.StatusBadRequest, "The token goes in the form below, never in the address."
		}
		c.render(w, r, code, "login", p)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad sign-in form", http.StatusBadRequest)
		return
	}
	next := localPath(r.PostForm.Get("next"))
	if !c.tokenMatches(r.PostForm.Get("token")) {
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Error: "wrong token", Data: next})
		return
	}
	v, exp := c.sessions.issue()
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: v, Path: "/", Expires: exp, MaxAge: int(exp.Sub(c.cfg.Now()).Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: servedOverTLS(r),
	})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the browser's session (POST only): the cookie is cleared.
// The value itself stays valid until it expires (no replica keeps a list);
// changing the token ends every session at once.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "sign out with the form's button (POST)", http.StatusMethodNotAllowed)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: servedOverTLS(r)})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// servedOverTLS reports whether the browser reached the console over TLS:
// directly, or through a proxy that says so. A client that claims it
// falsely only gets a cookie it will not send back over plain HTTP.
func servedOverTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// localPath is p when it is a path on this console, else "/": the page to
// return to after signing in must not lead elsewhere.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return "/"
	}
	return p
}
