package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/console"
)

// post sends a form to path with the headers given (name, value pairs).
func (s *site) post(path string, form url.Values, header ...string) (int, http.Header, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url(path), strings.NewReader(form.Encode()))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, resp.Header, b.String()
}

// sessionCookie returns the session cookie a response set, nil if none.
func sessionCookie(h http.Header) *http.Cookie {
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == "cronstream_session" {
			return c
		}
	}
	return nil
}

// TestConsoleSignIn: the sign-in form posts the token and gets a session
// cookie that is not the token (HTTP-only, SameSite=Strict, Secure behind
// TLS, expiring), which opens every page until it expires or the browser
// signs out; a token in the address signs nothing in; another origin's
// POST is refused; a forged, expired or old-style cookie opens nothing.
func TestConsoleSignIn(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64 // the console's clock, moved past the expiry
	s := startSite(t, console.Config{Token: "s3cret", SessionTTL: time.Hour, Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	origin := "http://" + s.addr

	if code, h, _ := s.get("/login?token=s3cret"); code != http.StatusBadRequest || sessionCookie(h) != nil {
		t.Fatalf("token in the address: %d, cookie %v", code, sessionCookie(h))
	}
	if code, h, body := s.post("/login", url.Values{"token": {"wrong"}}, "Origin", origin); code != http.StatusUnauthorized || sessionCookie(h) != nil || !strings.Contains(body, "wrong token") {
		t.Fatalf("wrong token: %d, cookie %v", code, sessionCookie(h))
	}
	for _, hdr := range [][]string{{"Origin", "http://evil.example"}, {"Sec-Fetch-Site", "cross-site"}} {
		if code, h, _ := s.post("/login", url.Values{"token": {"s3cret"}}, hdr...); code != http.StatusForbidden || sessionCookie(h) != nil {
			t.Errorf("sign-in with %s: %d, cookie %v, want 403", hdr, code, sessionCookie(h))
		}
	}

	code, h, _ := s.post("/login", url.Values{"token": {"s3cret"}, "next": {"/entries?queue=q"}}, "Origin", origin, "Sec-Fetch-Site", "same-origin")
	ck := sessionCookie(h)
	if code != http.StatusSeeOther || h.Get("Location") != "/entries?queue=q" || ck == nil {
		t.Fatalf("sign-in: %d to %q, cookie %v", code, h.Get("Location"), ck)
	}
	if ck.Value == "s3cret" || strings.Contains(ck.Value, "s3cret") || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure || ck.MaxAge <= 0 || ck.MaxAge > 3600 {
		t.Fatalf("session cookie %+v", ck)
	}
	cookie := "cronstream_session=" + ck.Value
	if code, _, body := s.get("/", "Cookie", cookie); code != http.StatusOK || !strings.Contains(body, `action="/logout"`) {
		t.Fatalf("with the session: %d", code)
	}
	if _, h, _ := s.post("/login", url.Values{"token": {"s3cret"}}, "X-Forwarded-Proto", "https"); sessionCookie(h) == nil || !sessionCookie(h).Secure {
		t.Errorf("behind TLS the cookie must be Secure: %v", sessionCookie(h))
	}
	forged := []byte(ck.Value)
	forged[len(forged)/2] ^= 0x02
	for name, c := range map[string]string{
		"forged":     "cronstream_session=" + string(forged),
		"the token":  "cronstream_session=s3cret",
		"old cookie": "cronstream_console=s3cret",
	} {
		if code, _, _ := s.get("/", "Cookie", c); code != http.StatusUnauthorized {
			t.Errorf("%s cookie: %d, want 401", name, code)
		}
	}
	// The cookie in which earlier builds kept the token is cleared.
	_, h, _ = s.get("/", "Cookie", "cronstream_console=s3cret; "+cookie)
	if cleared := (&http.Response{Header: h}).Cookies(); len(cleared) != 1 || cleared[0].Name != "cronstream_console" || cleared[0].MaxAge >= 0 {
		t.Errorf("the old token cookie is not cleared: %v", cleared)
	}

	// Signing out clears the cookie (POST, from this origin only).
	if code, _, _ := s.get("/logout", "Cookie", cookie); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /logout: %d, want 405", code)
	}
	if code, h, _ := s.post("/logout", nil, "Cookie", cookie, "Origin", "http://evil.example"); code != http.StatusForbidden || sessionCookie(h) != nil {
		t.Errorf("sign-out from another origin: %d", code)
	}
	code, h, _ = s.post("/logout", nil, "Cookie", cookie, "Origin", origin)
	if out := sessionCookie(h); code != http.StatusSeeOther || out == nil || out.MaxAge >= 0 {
		t.Errorf("sign-out: %d, cookie %+v", code, out)
	}

	// Expiry, by the console's clock.
	offset.Store(int64(time.Hour + time.Second))
	if code, _, _ := s.get("/", "Cookie", cookie); code != http.StatusUnauthorized {
		t.Errorf("expired session: %d, want 401", code)
	}
}

// TestConsoleNoListings: no address lists a directory, with a token or
// without; the assets themselves are served.
func TestConsoleNoListings(t *testing.T) {
	t.Parallel()
	for _, cfg := range []console.Config{{}, {Token: "s3cret"}} {
		s := startSite(t, cfg)
		for _, path := range []string{"/static/", "/static", "/static/.", "/static/..", "/static//", "/static/%2e/", "/static/../static/"} {
			code, _, body := s.get(path)
			// A listing links each file by its bare name.
			if code == http.StatusOK || strings.Contains(body, `href="live.js"`) || strings.Contains(body, `href="favicon.svg"`) {
				t.Errorf("token %t: %s answers %d listing files:\n%.500s", cfg.Token != "", path, code, body)
			}
		}
		for _, path := range []string{"/static/live.js", "/static/style.css", "/static/favicon.svg"} {
			if code, _, _ := s.get(path); code != http.StatusOK {
				t.Errorf("token %t: %s: %d", cfg.Token != "", path, code)
			}
		}
	}
}
