package main

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/testenv"
)

// permissionsFile is the deployment's NATS permissions file, the one
// docker-compose.yml mounts.
var permissionsFile = filepath.Join("..", "..", "deploy", "nats", "permissions.conf")

// natsUsers are the users of permissionsFile and the variable each one's
// password comes from.
var natsUsers = map[string]string{
	"cronstream-streams":  "CRONSTREAM_STREAMS_NATS_PASSWORD",
	"cronstream-replica":  "CRONSTREAM_REPLICA_NATS_PASSWORD",
	"cronstream-1":        "CRONSTREAM_REPLICA_1_NATS_PASSWORD",
	"cronstream-2":        "CRONSTREAM_REPLICA_2_NATS_PASSWORD",
	"cronstream-3":        "CRONSTREAM_REPLICA_3_NATS_PASSWORD",
	"cronstream-operator": "CRONSTREAM_OPERATOR_NATS_PASSWORD",
	"cronstream-auditor":  "CRONSTREAM_AUDITOR_NATS_PASSWORD",
}

// permissionsConfig is permissionsFile with each user's password
// "pw-<user>" defined in it, as the deployment's environment would.
func permissionsConfig(t *testing.T) string {
	t.Helper()
	vars := map[string]string{}
	for user, v := range natsUsers {
		vars[v] = "pw-" + user
	}
	return testenv.NATSConfigWithVars(t, permissionsFile, vars)
}

// permissionsServer loads permissionsFile into an embedded server (the
// passwords defined by permissionsConfig) and returns it with the URL of
// each user.
func permissionsServer(t *testing.T) (*testenv.NATS, func(user string) string) {
	t.Helper()
	n := testenv.StartNATSFromConfig(t, permissionsConfig(t))
	host := strings.TrimPrefix(n.URL(), "nats://")
	return n, func(user string) string { return "nats://" + user + ":pw-" + user + "@" + host }
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

// isViolation reports whether err is a NATS permissions violation.
func isViolation(err error) bool {
	return err != nil && (errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation"))
}

// violations returns the permission violations the server logged, as
// `"$G/user:<user>" - Publish Violation - Subject "<subject>"` and the
// like.
func violations(n *testenv.NATS) []string {
	var out []string
	for _, l := range strings.Split(n.Log(), "\n") {
		if _, v, found := strings.Cut(l, `"$G/user:`); found && strings.Contains(l, "Violation") {
			out = append(out, `"$G/user:`+v)
		}
	}
	return out
}

// TestNATSPermissions: with the deployment's permissions file, each role
// does its work and only its work: the streams step creates the streams,
// replicas (one as a per-replica user, one as the shared user) run and
// fire an entry the operator registered, the auditor reads; an operator
// cannot publish activity, an auditor cannot publish config, a replica
// cannot administer a stream, and no role may delete a consumer. Nothing
// a role did in its own work was refused: every violation the server
// logged is one provoked here.
func TestNATSPermissions(t *testing.T) {
	t.Parallel()
	n, url := permissionsServer(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	env := func(user string) *cliEnv {
		return &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+url(user), "CRONSTREAM_REDIS="+r.URL)}
	}
	streams, operator, auditor := env("cronstream-streams"), env("cronstream-operator"), env("cronstream-auditor")

	// A replica started before the streams exist may not create them: it
	// waits, not ready, saying why.
	first := start(t, env("cronstream-1").vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "cronstream-1")
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(first.Stderr(), "waiting for `cronstream streams apply`") },
		"the replica does not say it waits for streams apply:\n%v", lazy(first.Stderr))
	firstAddr, _ := logValue(first.Stderr(), "serving http", "addr")
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := readyz("http://" + firstAddr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "streams apply")
	}, "readyz of the waiting replica does not say it waits for streams apply")

	// Only the streams role creates or changes streams.
	if msg := operator.fail("streams", "apply"); !strings.Contains(strings.ToLower(msg), "permission") {
		t.Errorf("operator's streams apply: %s", msg)
	}
	streams.ok("streams", "apply")

	var addrs []string
	procs := []*proc{first}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica cronstream-1 stderr:\n%s", first.Stderr())
		}
	})
	addrs = append(addrs, firstAddr)
	for _, c := range []struct{ user, id string }{{"cronstream-replica", "limited"}} {
		p := start(t, env(c.user).vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", c.id)
		procs = append(procs, p)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("replica %s stderr:\n%s", c.id, p.Stderr())
			}
		})
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok
		}, "run did not log its HTTP address")
		addrs = append(addrs, addr)
	}
	for _, addr := range addrs {
		testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus("http://"+addr+"/readyz") == http.StatusOK }, "replica never ready")
	}

	operator.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	operator.ok("sync", "-f", writeFile(t, "schedules.yaml", schedules), "--owner", "test")
	operator.ok("entry", "pause", "cleanup")
	operator.ok("entry", "trigger", "cleanup")
	ins := inspector(t, r.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "the entry never fired")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(auditor.ok("audit", "--type", "entry.fired"), "tick")
	}, "the auditor never saw a fired event")
	for _, args := range [][]string{{"entry", "ls"}, {"entry", "get", "tick"}, {"entry", "history", "tick"}, {"entry", "describe", "tick"}, {"status"}} {
		auditor.ok(args...)
		operator.ok(args...)
	}
	var st struct {
		Replicas []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"replicas"`
	}
	auditor.okJSON(&st, "status", "--json")
	if len(st.Replicas) != 2 || st.Replicas[0].ID != "cronstream-1" || st.Replicas[1].ID != "limited" || st.Replicas[0].State != "live" {
		t.Errorf("auditor's status replicas: %+v", st.Replicas)
	}

	// What each role may not do.
	refused := map[string]bool{
		`"$G/user:cronstream-operator" - Publish Violation - Subject "$JS.API.STREAM.LIST"`:              true,
		`"$G/user:cronstream-1" - Publish Violation - Subject "$JS.API.STREAM.CREATE.CRONSTREAM_CONFIG"`: true,
	}
	type attempt struct{ user, subject string }
	attempts := []attempt{
		{"cronstream-operator", "cronstream.fire.tick"},
		{"cronstream-operator", "cronstream.recovery.default"},
		{"cronstream-operator", "cronstream.failpause.tick"},
		{"cronstream-auditor", "cronstream.config.tick"},
		{"cronstream-auditor", "cronstream.fire.tick"},
		{"cronstream-auditor", "cronstream.failpause.tick"},
	}
	for _, user := range []string{"cronstream-replica", "cronstream-1"} {
		for _, s := range []string{"cronstream.config.tick", "$JS.API.STREAM.UPDATE.CRONSTREAM_ACTIVITY", "$JS.API.STREAM.DELETE.CRONSTREAM_CONFIG",
			"$JS.API.STREAM.CREATE.CRONSTREAM_ACTIVITY", "$JS.API.STREAM.CREATE.KV_CRONSTREAM_REPLICAS", "$JS.API.STREAM.DELETE.KV_CRONSTREAM_REPLICAS", "$JS.API.INFO"} {
			attempts = append(attempts, attempt{user, s})
		}
	}
	attempts = append(attempts, attempt{"cronstream-1", "$KV.CRONSTREAM_REPLICAS.limited"})
	for user := range natsUsers {
		attempts = append(attempts, attempt{user, "$JS.API.CONSUMER.DELETE.CRONSTREAM_CONFIG.someone"},
			attempt{user, "$JS.API.STREAM.PURGE.CRONSTREAM_CONFIG"}, attempt{user, "$JS.API.STREAM.MSG.DELETE.CRONSTREAM_CONFIG"})
	}
	for _, a := range attempts {
		if err := refusedPublish(t, url(a.user), a.subject); !isViolation(err) {
			t.Errorf("%s publishing on %s: %v, want a permissions violation", a.user, a.subject, err)
		}
		refused[`"$G/user:`+a.user+`" - Publish Violation - Subject "`+a.subject+`"`] = true
	}
	// Stopping too: a replica's clean stop deletes nothing it may not.
	for _, p := range procs {
		if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("replica exited %d", code)
		}
	}
	for _, v := range violations(n) {
		if !refused[v] {
			t.Errorf("refused in a role's own work: %s", v)
		}
	}
}

// TestPermissionsFileReplicaUsers: the per-replica users of the
// permissions file have exactly the shared replica user's permissions
// but the heartbeat, which is their own id's only; in the bucket `streams
// apply` makes, a write on its own key cannot remove another's heartbeat
// (replicaRollupRefused).
func TestPermissionsFileReplicaUsers(t *testing.T) {
	t.Parallel()
	opts, err := server.ProcessConfigFile(permissionsConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	perms := map[string]*server.Permissions{}
	for _, u := range opts.Users {
		perms[u.Username] = u.Permissions
	}
	shared := perms["cronstream-replica"]
	if shared == nil {
		t.Fatal("no cronstream-replica user")
	}
	without := func(subjects []string, drop string) []string {
		return slices.DeleteFunc(slices.Clone(subjects), func(s string) bool { return s == drop })
	}
	base := without(shared.Publish.Allow, "$KV.CRONSTREAM_REPLICAS.*")
	for _, id := range []string{"cronstream-1", "cronstream-2", "cronstream-3"} {
		p := perms[id]
		if p == nil {
			t.Fatalf("no user %s", id)
		}
		if !slices.Contains(p.Publish.Allow, "$KV.CRONSTREAM_REPLICAS."+id) || !slices.Equal(without(p.Publish.Allow, "$KV.CRONSTREAM_REPLICAS."+id), base) ||
			!slices.Equal(p.Subscribe.Allow, shared.Subscribe.Allow) {
			t.Errorf("user %s: publish %v, subscribe %v; want the replica role's with heartbeat key %s", id, p.Publish.Allow, p.Subscribe.Allow, id)
		}
	}
	for user, p := range perms {
		for _, s := range p.Publish.Allow {
			if strings.Contains(s, "CONSUMER.DELETE") || strings.HasPrefix(s, "$JS.API.STREAM.") && user != "cronstream-streams" &&
				!strings.HasPrefix(s, "$JS.API.STREAM.INFO.") && !strings.HasPrefix(s, "$JS.API.STREAM.MSG.GET.") {
				t.Errorf("user %s may publish on %s", user, s)
			}
		}
	}
	replicaRollupRefused(t)
}

// replicaRollupRefused: as cronstream-1, with cronstream-2's heartbeat in
// the bucket `streams apply` made, a publish on its own key with a
// rollup header (all: purge the whole bucket; sub: purge its own key) is
// refused by the stream and cronstream-2's heartbeat stays, as `status`
// reads it. Its own puts and the delete of a stopping replica still work.
func replicaRollupRefused(t *testing.T) {
	n, url := permissionsServer(t)
	streams := &cliEnv{t: t, nats: n, vars: append(baseEnv(), "CRONSTREAM_NATS="+url("cronstream-streams"), "CRONSTREAM_REDIS=redis://127.0.0.1:1")}
	streams.ok("streams", "apply")
	names := events.MustNames("")
	ctx := testenv.Context(t, 30*time.Second)
	bucket := func(a *attacker) jetstream.KeyValue {
		kv, err := a.js.KeyValue(ctx, names.ReplicasBucket())
		if err != nil {
			t.Fatalf("%s: open the bucket: %v", a.user, err)
		}
		return kv
	}
	one, two := connectAs(t, "cronstream-1", url("cronstream-1")), connectAs(t, "cronstream-2", url("cronstream-2"))
	kv1, kv2 := bucket(one), bucket(two)
	if _, err := kv2.Put(ctx, "cronstream-2", []byte(`{"id":"cronstream-2"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv1.Put(ctx, "cronstream-1", []byte(`{"id":"cronstream-1"}`)); err != nil {
		t.Fatal(err)
	}
	auditor := connectAs(t, "cronstream-auditor", url("cronstream-auditor"))
	heartbeats := func() []string {
		infos, err := replica.ListReplicas(ctx, auditor.js, names)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, i := range infos {
			ids = append(ids, i.ID)
		}
		return ids
	}
	for _, rollup := range []string{jetstream.MsgRollupAll, jetstream.MsgRollupSubject} {
		h := nats.Header{}
		h.Set(jetstream.MsgRollup, rollup)
		_, err := one.js.PublishMsg(one.attempt(t), &nats.Msg{Subject: "$KV." + names.ReplicasBucket() + ".cronstream-1", Header: h, Data: []byte(`{"id":"cronstream-1"}`)})
		if err == nil {
			t.Errorf("a rollup %q on its own key was stored", rollup)
		}
		if got := heartbeats(); !slices.Contains(got, "cronstream-2") {
			t.Fatalf("after a rollup %q of cronstream-1: heartbeats %v, cronstream-2's is gone", rollup, got)
		}
	}
	if err := kv1.Delete(ctx, "cronstream-1"); err != nil {
		t.Fatalf("a stopping replica's delete: %v", err)
	}
	if got := heartbeats(); !slices.Equal(got, []string{"cronstream-2"}) {
		t.Fatalf("after cronstream-1's delete: heartbeats %v, want cronstream-2's alone", got)
	}
}

// TestPauseOnFailureWithPermissions: pause on failure end to end with the
// repository's permissions file. A real asynq worker archives a task of
// an entry armed with pause_on_failure (its handler fails, no retry); the
// replica, connected as its per-replica user (which may not publish
// config), pauses the entry through a fail-pause request; `entry history`
// and `audit` show the pause on failure, the entry fires no more, and the
// server refused nothing.
func TestPauseOnFailureWithPermissions(t *testing.T) {
	t.Parallel()
	n, url := permissionsServer(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	env := func(user string) *cliEnv {
		return &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+url(user), "CRONSTREAM_REDIS="+r.URL)}
	}
	operator, auditor := env("cronstream-operator"), env("cronstream-auditor")
	env("cronstream-streams").ok("streams", "apply")
	p := start(t, env("cronstream-1").vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "cronstream-1")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica stderr:\n%s", p.Stderr())
		}
	})
	operator.ok("entry", "put", "failing", "--cron", "@every 1s", "--type", "fails", "--queue", "pofq", "--max-retry", "0", "--pause-on-failure")

	opt, err := asynq.ParseRedisURI(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 2, Queues: map[string]int{"pofq": 1}, Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return errors.New("disk full") })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	testenv.Eventually(t, 60*time.Second, func() bool {
		var e events.Entry
		auditor.okJSON(&e, "entry", "get", "failing", "--json")
		return e.Paused
	}, "the entry was never paused on failure")
	var e events.Entry
	auditor.okJSON(&e, "entry", "get", "failing", "--json")
	if !strings.HasPrefix(e.Note, events.FailPauseNotePrefix+"task cronstream:failing:") || !strings.HasSuffix(e.Note, ": disk full") {
		t.Errorf("pause note %q", e.Note)
	}
	history := auditor.ok("entry", "history", "failing")
	if !strings.Contains(history, "on failure (fail-pause request)") || !strings.Contains(history, "cronstream-1") {
		t.Errorf("entry history does not show the pause on failure by the replica:\n%s", history)
	}
	var recs []historyRecord
	auditor.okJSON(&recs, "entry", "history", "failing", "--json")
	if len(recs) != 2 || !recs[1].FailPause || recs[1].Entry == nil || !recs[1].Entry.Paused {
		t.Errorf("entry history --json: %+v", recs)
	}
	if out := auditor.ok("audit", "--entry", "failing", "--type", "paused"); !strings.Contains(out, "on failure, by cronstream/cronstream-1") {
		t.Errorf("audit does not show the pause on failure:\n%s", out)
	}
	// Paused: no tick fires after the pause settled.
	ins := inspector(t, r.URL)
	count := func() int {
		q, err := ins.GetQueueInfo("pofq")
		if err != nil {
			t.Fatal(err)
		}
		return q.Size + q.Processed
	}
	settled := count()
	deadline := time.Now().Add(3 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(deadline) }, "")
	if got := count(); got > settled+2 {
		t.Errorf("%d tasks after the pause, %d more than when it settled", got, got-settled)
	}
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Errorf("replica exited %d", code)
	}
	if v := violations(n); len(v) > 0 {
		t.Errorf("refused in the roles' own work: %v", v)
	}
}
