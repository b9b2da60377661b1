package main

import (
	"net/http"
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
