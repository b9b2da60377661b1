package replica

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

// readyz returns /readyz's status and body.
func readyz(addr string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// authErrors reads cronstream_auth_errors_total{system} from /metrics.
func authErrors(t *testing.T, addr, system string) float64 {
	t.Helper()
	return metricValue(t, addr, `cronstream_auth_errors_total{system="`+system+`"}`)
}

// metricValue reads one series (its name and labels as /metrics prints
// them) from /metrics.
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /metrics", series)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// startWatched runs a replica until the test ends and returns its HTTP
// address once it is ready, and its log.
func startWatched(t *testing.T, cfg Config) (string, *testlog.Buffer, <-chan error) {
	t.Helper()
	_, addr, logs, done := runWatched(t, cfg)
	return addr, logs, done
}

// runWatched is startWatched that returns the replica too.
func runWatched(t *testing.T, cfg Config) (*Replica, string, *testlog.Buffer, <-chan error) {
	t.Helper()
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.RecoverInterval = 200 * time.Millisecond
	ready := make(chan string, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	r, err := newReplica(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.auth.hold = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case addr := <-ready:
		testenv.Eventually(t, 20*time.Second, func() bool { code, _ := readyz(addr); return code == http.StatusOK }, "never ready:\n%s", logs)
		return r, addr, logs, done
	case err := <-done:
		t.Fatalf("Run: %v\n%s", err, logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("replica did not start:\n%s", logs)
	}
	return nil, "", nil, nil
}

// TestRedisRefusalAfterStartup: when Redis starts refusing a running
// replica (permissions withdrawn, password changed), the replica stays up,
// counts and logs it, and /readyz says why; once Redis accepts it again it
// is ready again.
func TestRedisRefusalAfterStartup(t *testing.T) {
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t, testenv.WithPrivateServer())
	admin := rd.Client(t)
	ctx := context.Background()
	acl := func(args ...any) {
		t.Helper()
		if err := admin.Do(ctx, append([]any{"ACL"}, args...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acl("SETUSER", "cron", "on", ">right", "~*", "&*", "+@all")
	rc := redis.NewClient(&redis.Options{Addr: rd.Addr, Username: "cron", Password: "right"})
	t.Cleanup(func() { rc.Close() })
	addr, logs, done := startWatched(t, Config{NATSURL: ns.URL(), Redis: rc, Names: events.MustNames("authwatch")})

	notReady := func(want string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() bool {
			code, body := readyz(addr)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "auth") && strings.Contains(body, want)
		}, "/readyz does not name %q:\n%s", want, logs)
	}
	readyAgain := func() {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() bool { code, _ := readyz(addr); return code == http.StatusOK },
			"/readyz not back to 200: %v", func() string { _, b := readyz(addr); return b }())
	}

	// Permissions withdrawn: NOPERM on everything but PING.
	acl("SETUSER", "cron", "-@all", "+ping", "+hello", "+auth", "+client")
	notReady("NOPERM")
	if n := authErrors(t, addr, "redis"); n < 1 {
		t.Errorf("cronstream_auth_errors_total{system=\"redis\"} = %v", n)
	}
	if !strings.Contains(logs.String(), "the Redis user lacks a permission after start-up") {
		t.Errorf("no log line for the refusal:\n%s", logs)
	}
	acl("SETUSER", "cron", "+@all")
	readyAgain()

	// Password changed and its connections dropped: WRONGPASS on every new
	// connection.
	acl("SETUSER", "cron", "resetpass", ">changed")
	if err := admin.Do(ctx, "CLIENT", "KILL", "USER", "cron").Err(); err != nil {
		t.Fatal(err)
	}
	notReady("Redis refuses the credentials")
	if !strings.Contains(logs.String(), "Redis refused the credentials after start-up") {
		t.Errorf("no log line for the refused credentials:\n%s", logs)
	}
	acl("SETUSER", "cron", "resetpass", ">right")
	readyAgain()
	if !strings.Contains(logs.String(), "Redis accepts the replica again") {
		t.Errorf("no log line for the recovery:\n%s", logs)
	}

	// One line per bout, not one per refused command.
	if n := strings.Count(logs.String(), "after start-up"); n > 4 {
		t.Errorf("%d log lines for two bouts of refusals:\n%s", n, logs)
	}
	select {
	case err := <-done:
		t.Fatalf("the replica stopped: %v", err)
	default:
	}
}

// natsUsersConf writes a nats-server configuration with an admin user and
// the replica's user rep with password pw, whose permissions are perms.
func natsUsersConf(t *testing.T, path, pw, perms string) {
	t.Helper()
	conf := `accounts: {
  A: {
    jetstream: enabled
    users: [
      {user: admin, password: admin}
      {user: rep, password: ` + pw + `, permissions: ` + perms + `}
    ]
  }
}
`
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNATSCredentialsRefusedAfterStartup: NATS refuses a running replica's
// credentials when it reconnects; the replica stays up, counts it, /readyz
// names it, and it is ready again once NATS takes them back.
func TestNATSCredentialsRefusedAfterStartup(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	all := `{publish: ">", subscribe: ">"}`
	natsUsersConf(t, conf, "rep", all)
	ns := testenv.StartNATSFromConfig(t, conf)
	rd := testenv.StartRedis(t)
	repURL := strings.Replace(ns.URL(), "nats://", "nats://rep:rep@", 1)
	addr, logs, done := startWatched(t, Config{NATSURL: repURL, Redis: rd.Client(t), Names: events.MustNames("authc")})

	natsUsersConf(t, conf, "changed", all)
	ns.Restart(t)
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, body := readyz(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "NATS refused the credentials")
	}, "/readyz does not name the refused credentials:\n%s", logs)
	if n := authErrors(t, addr, "nats"); n < 1 {
		t.Errorf("cronstream_auth_errors_total{system=\"nats\"} = %v", n)
	}
	if !strings.Contains(logs.String(), "NATS refused the credentials after start-up") {
		t.Errorf("no log line for the refused credentials:\n%s", logs)
	}

	natsUsersConf(t, conf, "rep", all)
	ns.Restart(t)
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := readyz(addr); return code == http.StatusOK },
		"/readyz not back to 200 after NATS took the credentials back:\n%s", logs)
	select {
	case err := <-done:
		t.Fatalf("the replica stopped: %v", err)
	default:
	}
}

// TestNATSPermissionViolationAfterStartup: a replica whose NATS user may
// not publish its fires stays up, counts the violation, logs it and
// /readyz names it.
func TestNATSPermissionViolationAfterStartup(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	natsUsersConf(t, conf, "rep", `{publish: {allow: [">"], deny: ["authn.fire.>"]}, subscribe: {allow: [">"]}}`)
	ns := testenv.StartNATSFromConfig(t, conf)
	rd := testenv.StartRedis(t)
	names := events.MustNames("authn")
	repURL := strings.Replace(ns.URL(), "nats://", "nats://rep:rep@", 1)
	addr, logs, done := startWatched(t, Config{NATSURL: repURL, Redis: rd.Client(t), Names: names})

	admin := ns.Connect(t, nats.UserInfo("admin", "admin"))
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := events.NewClient(js, names).Put(ctx, events.Entry{ID: "denied", Cron: "@every 1s", Task: events.Task{Type: "t"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, body := readyz(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "auth") && strings.Contains(body, "authn.fire.denied")
	}, "/readyz does not name the violation:\n%s", logs)
	if n := authErrors(t, addr, "nats"); n < 1 {
		t.Errorf("cronstream_auth_errors_total{system=\"nats\"} = %v", n)
	}
	if !strings.Contains(logs.String(), "the NATS user lacks a permission after start-up") {
		t.Errorf("no log line for the violation:\n%s", logs)
	}
	select {
	case err := <-done:
		t.Fatalf("the replica stopped: %v", err)
	default:
	}
}
