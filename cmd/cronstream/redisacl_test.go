package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// loadACLFile creates the users of deploy/redis/users.acl on rc, each with
// password pw, as the file says to load them (ACL SETUSER per line).
func loadACLFile(t *testing.T, rc *redis.Client, pw string) []string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/redis/users.acl")
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "user" {
			continue
		}
		args := []any{"ACL", "SETUSER"}
		for _, w := range f[1:] {
			args = append(args, w)
		}
		if err := rc.Do(context.Background(), append(args, ">"+pw)...).Err(); err != nil {
			t.Fatalf("ACL SETUSER from %q: %v", line, err)
		}
		users = append(users, f[1])
	}
	return users
}

// aclDenials returns what Redis's ACL log holds, but CONFIG (which
// cronstream is meant to be refused, and only warns about).
func aclDenials(t *testing.T, rc *redis.Client) []string {
	t.Helper()
	entries, err := rc.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		s := fmt.Sprint(e)
		if !strings.Contains(s, "config|get") {
			out = append(out, s)
		}
	}
	return out
}

// TestRedisACL runs the real binary as the users of deploy/redis/users.acl:
// the replica fires (its relay waiting for the Redis replica: INFO, WAIT),
// cancels a running task overlap cancel-previous replaces and recovers a
// task whose worker died, the operator triggers and reads status, and
// Redis logs no denial but CONFIG's.
func TestRedisACL(t *testing.T) {
	t.Parallel()
	rd := testenv.StartRedis(t, testenv.WithPrivateServer())
	testenv.StartRedisReplica(t, rd)
	admin := rd.Client(t)
	ctx := context.Background()
	if users := loadACLFile(t, admin, "acl-s3cret"); len(users) != 2 {
		t.Fatalf("users in the ACL file: %v", users)
	}
	pwFile := writeFile(t, "redis-password", "acl-s3cret\n")
	e := newEnv(t, false)
	e.redis = rd
	e.vars = append(e.vars, "CRONSTREAM_REDIS="+rd.URL, "CRONSTREAM_REDIS_PASSWORD_FILE="+pwFile)
	as := func(user string, args ...string) []string { return append(args, "--redis-username", user) }

	p := start(t, e.vars, as("cronstream-replica", "run", "--http", "127.0.0.1:0", "--log-format", "json",
		"--replica-id", "acl-replica", "--recover-interval", "500ms", "--recover-grace", "1s")...)
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address:\n%s", p.Stderr())
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus("http://"+addr+"/readyz") == http.StatusOK }, "/readyz never 200 as the ACL user:\n%s", p.Stderr())
	if !strings.Contains(p.Stderr(), "cannot read Redis configuration") {
		t.Errorf("no warning about the denied CONFIG GET:\n%s", p.Stderr())
	}

	// It fires.
	e.ok("entry", "put", "acl", "--cron", "@every 1s", "--type", "acl:tick")
	ins := inspector(t, rd.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 1 }, "nothing fired as the ACL user:\n%s", p.Stderr())

	// It recovers the tasks of a worker pool that died (active, lease
	// expired), as a mass crash: enough of them, between live ones, for
	// the list to be read and taken off its tail in windows.
	k := taskstate.Keys("work")
	const dead = 3000
	pipe := admin.Pipeline()
	pipe.SAdd(ctx, taskstate.AllQueuesKey, "work")
	for i := range dead + dead/10 {
		id, lease := fmt.Sprintf("dead-%04d", i), time.Now().Add(-time.Minute)
		if i%11 == 10 {
			id, lease = fmt.Sprintf("live-%04d", i), time.Now().Add(time.Hour)
		}
		msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "work", Payload: []byte("x"), ID: id, Queue: "work", Retry: 25, Timeout: 1800})
		if err != nil {
			t.Fatal(err)
		}
		pipe.HSet(ctx, k.Task(id), "msg", msg, "state", taskstate.StateActive)
		pipe.LPush(ctx, k.Active(), id)
		pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(lease.Unix()), Member: id})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return admin.ZCard(ctx, k.Retry()).Val() == dead }, "lease-expired tasks not recovered as the ACL user:\n%s", p.Stderr())

	// Overlap cancel-previous publishes on asynq:cancel the id of the
	// running task a tick replaces. A "worker" (the admin here) takes the
	// entry's pending task and runs it, with a live lease so the recoverer
	// leaves it; the next tick is then held and the running task cancelled.
	sub := admin.Subscribe(ctx, "asynq:cancel")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	e.ok("entry", "put", "acl-cancel", "--cron", "@every 1s", "--type", "acl:cancel", "--queue", "canc", "--overlap", "cancel-previous")
	ck := taskstate.Keys("canc")
	run := redis.NewScript(`
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[2])
if not id then return false end
redis.call('HSET', KEYS[4] .. id, 'state', 'active')
redis.call('ZADD', KEYS[3], ARGV[1], id)
return id`)
	running := map[string]bool{}
	cancelled := ""
	testenv.Eventually(t, 30*time.Second, func() bool {
		if id, err := run.Run(ctx, admin, []string{ck.Pending(), ck.Active(), ck.Lease(), ck.TaskPrefix()}, time.Now().Add(time.Hour).Unix()).Text(); err == nil {
			running[id] = true
		}
		select {
		case m := <-sub.Channel():
			cancelled = m.Payload
			return running[cancelled]
		case <-time.After(200 * time.Millisecond):
			return false
		}
	}, "no cancellation of a running task (%v) published as the ACL user (got %q):\n%v", lazy(func() string { return fmt.Sprint(slices.Sorted(maps.Keys(running))) }),
		lazy(func() string { return cancelled }), lazy(p.Stderr))

	// The operator's commands: trigger as the replica user, status as the
	// read-only one.
	e.ok(as("cronstream-replica", "entry", "trigger", "acl")...)
	var st struct {
		Replicas []struct {
			ID        string            `json:"id"`
			RedisWait *relay.WaitStatus `json:"redis_wait"`
		} `json:"replicas"`
		Warnings []string `json:"warnings"`
	}
	e.okJSON(&st, as("cronstream-status", "status", "--json")...)
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "acl-replica" {
		t.Errorf("status as cronstream-status: replicas %+v", st.Replicas)
	} else if w := st.Replicas[0].RedisWait; w == nil || w.Replicas != 1 || w.Behind || w.Unconfirmed != 0 {
		t.Errorf("status: the relay does not wait for the Redis replica, or its events went unconfirmed: %+v", w)
	}
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "cannot read Redis configuration") {
		t.Errorf("status warnings: %q", st.Warnings)
	}

	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d\n%s", code, p.Stderr())
	}
	if d := aclDenials(t, admin); len(d) > 0 {
		t.Errorf("Redis denied cronstream (a command or key missing from deploy/redis/users.acl):\n%s", strings.Join(d, "\n"))
	}
}
