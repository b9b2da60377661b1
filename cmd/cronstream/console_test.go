package main

import (
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestConsoleFlags: dev serves the console by default, run only with
// --console, and --http-token (here from the environment) guards it.
func TestConsoleFlags(t *testing.T) {
	t.Parallel()
	status := func(url, token string) int {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		resp.Body.Close()
		if !strings.HasSuffix(url, "/healthz") && resp.StatusCode == 200 && !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("%s: no Content-Security-Policy", url)
		}
		return resp.StatusCode
	}

	dev, _, _ := startDev(t, t.TempDir())
	line := dev.line("open http://", 10*time.Second)
	url := strings.Fields(strings.TrimSpace(line))[1]
	if code := status(url, ""); code != 200 {
		t.Fatalf("dev console %s: %d", url, code)
	}
	dev.stop(syscall.SIGINT, 20*time.Second)

	e := newEnv(t, true)
	httpOf := func(p *proc) string {
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok
		}, "run did not log its HTTP address")
		base := "http://" + addr
		testenv.Eventually(t, 30*time.Second, func() bool { return status(base+"/healthz", "") == 200 }, "no /healthz")
		return base
	}
	plain := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "plain")
	base := httpOf(plain)
	if code := status(base+"/", ""); code != http.StatusNotFound {
		t.Errorf("run without --console serves /: %d", code)
	}
	plain.stop(syscall.SIGTERM, 20*time.Second)

	guarded := start(t, append(e.vars, "CRONSTREAM_HTTP_TOKEN=tok-123"), "run", "--http", "127.0.0.1:0", "--log-format", "json", "--console", "--replica-id", "guarded")
	base = httpOf(guarded)
	testenv.Eventually(t, 30*time.Second, func() bool { return status(base+"/", "tok-123") == 200 }, "console never served with the token")
	if code := status(base+"/", ""); code != http.StatusUnauthorized {
		t.Errorf("console without the token: %d", code)
	}
	if strings.Contains(guarded.Stdout()+guarded.Stderr(), "tok-123") {
		t.Errorf("the token is in the log:\n%s", guarded.Stderr())
	}
	guarded.stop(syscall.SIGTERM, 20*time.Second)
}

// TestConsoleSessionAcrossReplicas: a session signed in on one replica
// opens the console of every replica given the same token (a load balancer
// may send the next request anywhere) and of none given another token (a
// rotated token ends every session).
func TestConsoleSessionAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	replica := func(id, token string) string {
		p := start(t, append(e.vars, "CRONSTREAM_HTTP_TOKEN="+token), "run", "--http", "127.0.0.1:0", "--log-format", "json", "--console", "--replica-id", id)
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok
		}, "%s did not log its HTTP address", id)
		return "http://" + addr
	}
	a, b, rotated := replica("a", "tok-shared"), replica("b", "tok-shared"), replica("c", "tok-rotated")
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(base, cookie string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/entries", nil)
		req.Header.Set("Cookie", cookie)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var cookie string
	testenv.Eventually(t, 30*time.Second, func() bool {
		resp, err := noRedirect.PostForm(a+"/login", url.Values{"token": {"tok-shared"}})
		if err != nil {
			return false
		}
		resp.Body.Close()
		for _, c := range resp.Cookies() {
			if c.Name == "cronstream_session" {
				cookie = c.Name + "=" + c.Value
			}
		}
		return cookie != "" && get(a, cookie) == http.StatusOK
	}, "no session from replica a")
	if strings.Contains(cookie, "tok-shared") {
		t.Fatalf("the session cookie holds the token: %s", cookie)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return get(b, cookie) == http.StatusOK }, "replica b does not accept a's session")
	if code := get(rotated, cookie); code != http.StatusUnauthorized {
		t.Errorf("a replica with another token: %d, want 401", code)
	}
}
