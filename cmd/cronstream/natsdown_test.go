package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRunStartsWithNATSDown: a replica started while NATS is unreachable
// has no projection, so it fires nothing; /readyz says so and names NATS.
// Once NATS is reachable it loads the projection, becomes ready and fires.
func TestRunStartsWithNATSDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "nd", "--cron", "@every 1s", "--type", "x")
	e.nats.Shutdown()
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "nd")
	var base string
	testenv.Eventually(t, 30*time.Second, func() bool {
		addr, ok := logValue(p.Stderr(), "serving http", "addr")
		base = "http://" + addr
		return ok
	}, "no http server:\n%v", lazyStderr{p})
	var code int
	var body string
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body = readyz(base)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no projection") && strings.Contains(body, "NATS")
	}, "/readyz does not say the replica has no projection because NATS is down: %v %s", lazy(func() string { return http.StatusText(code) }), lazy(func() string { return body }))
	t.Logf("/readyz while NATS is down: %s", strings.TrimSpace(body))
	ins := inspector(t, e.redis.URL)
	if n := len(pendingTasks(t, ins, "default")); n != 0 {
		t.Fatalf("%d tasks fired without a projection", n)
	}

	e.nats.Restart(t)
	testenv.Eventually(t, 60*time.Second, func() bool {
		code, body = readyz(base)
		return code == http.StatusOK
	}, "not ready after NATS came back: %v", lazy(func() string { return body }))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) > 0 },
		"nothing fires after NATS came back:\n%v", lazyStderr{p})
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("run exited %d", code)
	}
}
