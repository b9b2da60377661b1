package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cronstream/cronstream/internal/testenv"
)

// startAuthNATS starts an embedded nats-server with JetStream that knows
// users: "cron" (password natsGood, every permission) and "nojs" (password
// natsGood, no JetStream API).
func startAuthNATS(t *testing.T) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "cron", Password: natsGood},
			{Username: "nojs", Password: natsGood, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Deny: []string{"$JS.API.>"}},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with users not ready")
	}
	return srv.ClientURL()
}

// Secrets the tests give and then look for in every output.
const (
	natsGood  = "N4TSg00dPW"
	natsBad   = "N4TSwr0ngPW"
	redisGood = "R3DISg00dPW"
	redisBad  = "R3DISwr0ngPW"
	fileBad   = "F1LEwr0ngPW"
)

var allSecrets = []string{natsGood, natsBad, redisGood, redisBad, fileBad}

// aclRedis starts a private redis-server with two ACL users: "cron" (every
// command) and "tiny" (PING and the connection handshake only); both use
// the password redisGood.
func aclRedis(t *testing.T) *testenv.Redis {
	t.Helper()
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	c := r.Client(t)
	ctx := context.Background()
	for _, args := range [][]any{
		{"ACL", "SETUSER", "cron", "on", ">" + redisGood, "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "tiny", "on", ">" + redisGood, "~*", "-@all", "+ping", "+hello", "+auth", "+client"},
	} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	return r
}

func noSecret(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range allSecrets {
		if strings.Contains(out, s) {
			t.Errorf("%s shows the secret %s:\n%s", what, s, out)
		}
	}
}

// TestSecretsNeverPrinted runs every command with endpoints that are wrong,
// unreachable, of the wrong scheme or unparsable, all carrying passwords,
// and looks for the passwords in everything printed.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "known", "--cron", "@daily", "--type", "t")
	authNATS := strings.TrimPrefix(startAuthNATS(t), "nats://")
	rd := aclRedis(t)
	pwFile := writeFile(t, "redis-password", fileBad+"\n")
	schedules := writeFile(t, "s.yaml", "entries:\n  - id: known\n    cron: '@hourly'\n    task: {type: t}\n")

	every := [][]string{
		{"entry", "put", "known", "--cron", "@hourly", "--type", "t"},
		{"entry", "get", "known"},
		{"entry", "ls"},
		{"entry", "rm", "gone"},
		{"entry", "pause", "known"},
		{"entry", "resume", "known"},
		{"entry", "history", "known"},
		{"entry", "trigger", "known"},
		{"entry", "backfill", "known", "--from", "-2h", "--to", "now", "--before-registration"},
		{"sync", "-f", schedules},
		{"audit", "--since", "-1h"},
		{"status"},
		{"status", "--json"},
	}
	scenes := []struct {
		name     string
		env      []string
		commands [][]string
		extra    []string // flags added to every command
	}{
		{"NATS unreachable", []string{"CRONSTREAM_NATS=nats://cron:" + natsGood + "@127.0.0.1:1,nats://cron:" + natsBad + "@127.0.0.1:2"}, every, nil},
		{"NATS wrong password", []string{"CRONSTREAM_NATS=nats://cron:" + natsBad + "@" + authNATS}, every, nil},
		{"NATS wrong scheme", []string{"CRONSTREAM_NATS=ftp://cron:" + natsGood + "@" + authNATS}, every[:3], nil},
		{"NATS unparsable", []string{"CRONSTREAM_NATS=nats://cron:" + natsGood + "@127.0.0.1:bad"}, every[:3], nil},
		{"Redis wrong password", []string{"CRONSTREAM_REDIS=redis://cron:" + redisBad + "@" + rd.Addr + "/0"}, every, nil},
		{"Redis unreachable", []string{"CRONSTREAM_REDIS=rediss://:" + redisGood + "@127.0.0.1:1"}, every[7:], nil},
		{"Redis wrong scheme", []string{"CRONSTREAM_REDIS=http://:" + redisGood + "@" + rd.Addr}, every[7:], nil},
		{"Redis unparsable", []string{"CRONSTREAM_REDIS=redis://:" + redisGood + "@127.0.0.1:bad"}, every[7:], nil},
		{"Redis unparsable, slash in password", []string{"CRONSTREAM_REDIS=redis://:" + redisGood + "/x@" + rd.Addr}, every[7:], nil},
		{"Redis cluster list", []string{"CRONSTREAM_REDIS=redis://:" + redisGood + "@127.0.0.1:1?addr=127.0.0.1:2&addr=:" + redisBad + "@127.0.0.1:3"}, every[7:], []string{"--redis-cluster"}},
		{"Redis password file", []string{"CRONSTREAM_REDIS=redis://cron@" + rd.Addr + "/0"}, every[7:], []string{"--redis-password-file", pwFile}},
		{"Redis password flag", []string{"CRONSTREAM_REDIS=redis://cron@" + rd.Addr + "/0"}, every[7:], []string{"--redis-password", redisBad}},
	}
	for _, sc := range scenes {
		t.Run(sc.name, func(t *testing.T) {
			env := *e
			env.t = t
			env.vars = append(append([]string(nil), e.vars...), sc.env...)
			failed := 0
			for _, args := range sc.commands {
				r := env.run(append(append([]string(nil), args...), sc.extra...)...)
				if r.code != 0 {
					failed++
				}
				noSecret(t, "cronstream "+strings.Join(args, " "), r.stdout+r.stderr)
			}
			if failed == 0 && !strings.Contains(sc.name, "scheme") {
				t.Errorf("no command failed: the scene does not test what it says")
			}
		})
	}

	t.Run("run", func(t *testing.T) {
		for _, sc := range []struct {
			name string
			env  []string
			args []string
		}{
			{"NATS unreachable", []string{"CRONSTREAM_NATS=nats://cron:" + natsGood + "@127.0.0.1:1"}, nil},
			{"NATS unparsable", []string{"CRONSTREAM_NATS=nats://cron:" + natsGood + "@127.0.0.1:bad"}, nil},
			{"NATS wrong password", []string{"CRONSTREAM_NATS=nats://cron:" + natsBad + "@" + authNATS}, nil},
			{"Redis wrong password", []string{"CRONSTREAM_REDIS=redis://cron:" + redisBad + "@" + rd.Addr + "/0"}, nil},
			{"Redis unreachable", []string{"CRONSTREAM_REDIS=rediss://:" + redisGood + "@127.0.0.1:1"}, nil},
			{"Redis password file", []string{"CRONSTREAM_REDIS=redis://cron@" + rd.Addr + "/0"}, []string{"--redis-password-file", pwFile}},
		} {
			t.Run(sc.name, func(t *testing.T) {
				env := append(append([]string(nil), e.vars...), sc.env...)
				p := start(t, env, append([]string{"run", "--http", "", "--log-level", "debug"}, sc.args...)...)
				// Either it exits (refused, unparsable) or it logs that it
				// retries (unreachable): both print the endpoint.
				testenv.Eventually(t, 20*time.Second, func() bool {
					select {
					case <-p.done:
						return true
					default:
					}
					return strings.Contains(p.Stderr(), "retrying")
				}, "run neither exited nor retried:\n%s", lazyStderr{p})
				select {
				case <-p.done:
				default:
					p.stop(syscall.SIGTERM, 20*time.Second)
				}
				noSecret(t, "run", p.Stdout()+p.Stderr())
			})
		}
	})
}

// lazyStderr prints a process's stderr when a failure message is built.
type lazyStderr struct{ p *proc }

func (l lazyStderr) String() string { return l.p.Stderr() }

// TestRunRefusesWhatWaitingCannotFix: credentials and permissions NATS or
// Redis refuse, and impossible stream settings, end `run` at start-up with
// the reason and a non-zero exit, within 10 s.
func TestRunRefusesWhatWaitingCannotFix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	authNATS := strings.TrimPrefix(startAuthNATS(t), "nats://")
	rd := aclRedis(t)
	goodNATS := "CRONSTREAM_NATS=nats://cron:" + natsGood + "@" + authNATS
	goodRedis := "CRONSTREAM_REDIS=redis://cron:" + redisGood + "@" + rd.Addr + "/0"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"Redis wrong password", []string{goodNATS, "CRONSTREAM_REDIS=redis://cron:" + redisBad + "@" + rd.Addr + "/0"}, nil,
			[]string{"Redis refused the credentials", "WRONGPASS"}},
		{"Redis NOPERM", []string{goodNATS, "CRONSTREAM_REDIS=redis://tiny:" + redisGood + "@" + rd.Addr + "/0"}, nil,
			[]string{"the Redis user lacks a permission", "NOPERM"}},
		{"NATS wrong password", []string{"CRONSTREAM_NATS=nats://cron:" + natsBad + "@" + authNATS, goodRedis}, nil,
			[]string{"NATS refused the credentials", "uthorization"}},
		{"NATS without JetStream permissions", []string{"CRONSTREAM_NATS=nats://nojs:" + natsGood + "@" + authNATS, goodRedis}, nil,
			[]string{"the NATS user lacks a permission"}},
		{"activity max age below the duplicate window", []string{goodNATS, goodRedis}, []string{"--activity-max-age", "5m"},
			[]string{"--activity-max-age 5m0s", "duplicate window"}},
		// A prefix of its own: streams that exist are never changed (a
		// replica only warns), so R3 must be asked of streams it creates.
		{"three stream replicas on one server", []string{goodNATS, goodRedis}, []string{"--prefix", "rthree", "--replicas", "3"},
			[]string{"JetStream refused the stream settings"}},
		{"NATS unparsable", []string{"CRONSTREAM_NATS=nats://cron:" + natsGood + "@127.0.0.1:bad", goodRedis}, nil,
			[]string{"invalid URL", "not shown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := append(append([]string(nil), e.vars...), tc.env...)
			began := time.Now()
			p := start(t, env, append([]string{"run", "--http", ""}, tc.args...)...)
			select {
			case <-p.done:
			// A JetStream request the server denies is answered by an
			// asynchronous error only, so the refusal comes when the
			// request times out (a few seconds, more under a loaded -race
			// run); the bound says "refuses", not how fast.
			case <-time.After(20 * time.Second):
				p.stop(syscall.SIGTERM, 20*time.Second)
				t.Fatalf("still running after 20s:\n%s", p.Stderr())
			}
			if p.err == nil {
				t.Fatalf("exit 0 after %s, want a failure:\n%s", time.Since(began), p.Stderr())
			}
			for _, w := range tc.want {
				if !strings.Contains(p.Stderr(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, p.Stderr())
				}
			}
			noSecret(t, "run", p.Stdout()+p.Stderr())
		})
	}
	t.Run("NATS down is waited for", func(t *testing.T) {
		t.Parallel()
		env := append(append([]string(nil), e.vars...), "CRONSTREAM_NATS=nats://127.0.0.1:1")
		p := start(t, env, "run", "--http", "")
		testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(p.Stderr(), "NATS unreachable, retrying") },
			"no retry line:\n%s", lazyStderr{p})
		if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("exit %d after SIGTERM:\n%s", code, p.Stderr())
		}
	})
}

// TestRedisDownOneLine: with Redis down a command prints one error line,
// no library logging, and status --json marks what it could not read.
func TestRedisDownOneLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false) // Redis at 127.0.0.1:1
	e.ok("entry", "put", "known", "--cron", "@daily", "--type", "t")
	for _, args := range [][]string{{"entry", "trigger", "known"}, {"entry", "backfill", "known", "--from", "-2h", "--to", "now", "--before-registration"}} {
		msg := e.fail(args...)
		if lines := strings.Split(strings.TrimSpace(msg), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "cronstream: ") {
			t.Errorf("cronstream %s: want one error line, got:\n%s", strings.Join(args, " "), msg)
		}
	}
	r := e.run("status", "--json")
	if r.code == 0 {
		t.Fatalf("status succeeded without Redis:\n%s", r)
	}
	var st struct {
		Outbox struct {
			Backlog *int64 `json:"backlog"`
			Error   string `json:"error"`
		} `json:"outbox"`
		Queues      *[]any `json:"queues"`
		QueuesError string `json:"queues_error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r)
	}
	if st.Outbox.Backlog != nil || !strings.Contains(st.Outbox.Error, "connect to Redis") {
		t.Errorf("outbox %+v: want backlog null and the Redis error", st.Outbox)
	}
	if st.Queues != nil || st.QueuesError == "" {
		t.Errorf("queues %v (%q): want null and an error", st.Queues, st.QueuesError)
	}
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 {
		t.Errorf("status --json stderr: want one line, got:\n%s", r.stderr)
	}
}

// TestRedisPasswordFile: the password read from the file is used.
func TestRedisPasswordFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	rd := aclRedis(t)
	e.vars = append(e.vars, "CRONSTREAM_REDIS=redis://cron@"+rd.Addr+"/0")
	e.ok("entry", "put", "known", "--cron", "@daily", "--type", "t")
	pw := writeFile(t, "pw", redisGood+"\n")
	out := e.ok("entry", "trigger", "known", "--redis-password-file", pw)
	if !strings.Contains(out, "triggered entry known") {
		t.Errorf("trigger: %s", out)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := e.fail("entry", "trigger", "known", "--redis-password-file", empty); !strings.Contains(msg, "empty") {
		t.Errorf("empty password file: %s", msg)
	}
}

// TestDevHintSafeToPaste: dev's "Try, in another shell" line quotes a
// Redis URL with & and ? and shows no password.
func TestDevHintSafeToPaste(t *testing.T) {
	t.Parallel()
	rd := aclRedis(t)
	redisURL := "redis://cron:" + redisGood + "@" + rd.Addr + "/0?dial_timeout=3s&read_timeout=2s"
	p := start(t, baseEnv(), "dev", "--data-dir", t.TempDir(), "--nats-port", "-1", "--http", "127.0.0.1:0", "--redis", redisURL)
	line := p.line("export CRONSTREAM_NATS=", 60*time.Second)
	want := "CRONSTREAM_REDIS='redis://cron:xxxxx@" + rd.Addr + "/0?dial_timeout=3s&read_timeout=2s'"
	if !strings.Contains(line, want) {
		t.Errorf("hint %q lacks %q", line, want)
	}
	p.line("password is not shown", 10*time.Second)
	if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("dev exit %d:\n%s", code, p.Stderr())
	}
	noSecret(t, "dev", p.Stdout()+p.Stderr())
}
