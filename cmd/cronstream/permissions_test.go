package main

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cronstream/cronstream/internal/testenv"
)

// permissionsFile is the deployment's NATS permissions file, the one
// docker-compose.yml mounts.
var permissionsFile = filepath.Join("..", "..", "deploy", "nats", "permissions.conf")

// natsRoles are the users of permissionsFile, by role, and the variable
// each one's password comes from.
var natsRoles = map[string]string{
	"streams":  "CRONSTREAM_STREAMS_NATS_PASSWORD",
	"replica":  "CRONSTREAM_REPLICA_NATS_PASSWORD",
	"operator": "CRONSTREAM_OPERATOR_NATS_PASSWORD",
	"auditor":  "CRONSTREAM_AUDITOR_NATS_PASSWORD",
}

// refusedPublish publishes on subject as the user of url and returns the
// server's refusal, or nil when none came.
func refusedPublish(t *testing.T, url, subject string) error {
	t.Helper()
	errs := make(chan error, 10)
	nc, err := nats.Connect(url, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	if err := nc.Publish(subject, []byte("{}")); err != nil {
		return err
	}
	// The refusal comes before the answer to the flush's ping.
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	select {
	case err := <-errs:
		return err
	case <-time.After(2 * time.Second):
		return nil
	}
}

// TestNATSPermissions: with the deployment's permissions file, each role
// does its work and only its work: the streams step creates the streams, a
// replica runs and fires an entry the operator registered, the auditor
// reads; an operator cannot publish activity and an auditor cannot publish
// config.
func TestNATSPermissions(t *testing.T) {
	// Not parallel: the server takes the passwords from the environment.
	for role, v := range natsRoles {
		t.Setenv(v, "pw-"+role)
	}
	n := testenv.StartNATSFromConfig(t, permissionsFile)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	host := strings.TrimPrefix(n.URL(), "nats://")
	url := func(role string) string { return "nats://cronstream-" + role + ":pw-" + role + "@" + host }
	env := func(role string) *cliEnv {
		return &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+url(role), "CRONSTREAM_REDIS="+r.URL)}
	}
	streams, operator, auditor := env("streams"), env("operator"), env("auditor")

	// Only the streams role creates or changes streams.
	if msg := operator.fail("streams", "apply"); !strings.Contains(strings.ToLower(msg), "permission") {
		t.Errorf("operator's streams apply: %s", msg)
	}
	streams.ok("streams", "apply")

	p := start(t, env("replica").vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "limited")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica stderr:\n%s", p.Stderr())
		}
	})
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address")
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus("http://"+addr+"/readyz") == http.StatusOK }, "replica never ready")

	operator.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	operator.ok("sync", "-f", writeFile(t, "schedules.yaml", schedules), "--owner", "test")
	operator.ok("entry", "pause", "cleanup")
	operator.ok("entry", "trigger", "cleanup")
	ins := inspector(t, r.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "the entry never fired")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(auditor.ok("audit", "--type", "entry.fired"), "tick")
	}, "the auditor never saw a fired event")
	for _, args := range [][]string{{"entry", "ls"}, {"entry", "get", "tick"}, {"entry", "history", "tick"}, {"status"}} {
		auditor.ok(args...)
		operator.ok(args...)
	}
	var st struct {
		Replicas []struct {
			ID string `json:"id"`
		} `json:"replicas"`
	}
	auditor.okJSON(&st, "status", "--json")
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "limited" {
		t.Errorf("auditor's status replicas: %+v", st.Replicas)
	}

	// What each role may not do.
	refused := map[string]bool{`"$G/user:cronstream-operator" - Publish Violation - Subject "$JS.API.STREAM.CREATE.CRONSTREAM_CONFIG"`: true}
	for _, c := range []struct{ role, subject string }{
		{"operator", "cronstream.fire.tick"},
		{"operator", "cronstream.recovery.default"},
		{"auditor", "cronstream.config.tick"},
		{"auditor", "cronstream.fire.tick"},
		{"replica", "cronstream.config.tick"},
		{"replica", "$JS.API.STREAM.UPDATE.CRONSTREAM_ACTIVITY"},
		{"replica", "$JS.API.STREAM.DELETE.CRONSTREAM_CONFIG"},
		{"replica", "$JS.API.STREAM.CREATE.CRONSTREAM_ACTIVITY"},
		{"replica", "$JS.API.STREAM.DELETE.KV_CRONSTREAM_REPLICAS"},
	} {
		err := refusedPublish(t, url(c.role), c.subject)
		if err == nil || !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("%s publishing on %s: %v, want a permissions violation", c.role, c.subject, err)
		}
		refused[`"$G/user:cronstream-`+c.role+`" - Publish Violation - Subject "`+c.subject+`"`] = true
	}

	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Errorf("replica exited %d", code)
	}
	// Nothing a role did in its own work was refused: every violation the
	// server logged is one provoked above, anything else is a permission
	// missing from the file.
	for _, l := range strings.Split(n.Log(), "\n") {
		_, v, found := strings.Cut(l, `"$G/user:`)
		if !found || !strings.Contains(l, "Violation") {
			continue
		}
		if !refused[`"$G/user:`+v] {
			t.Errorf("refused in a role's own work: %s", l)
		}
	}
}
