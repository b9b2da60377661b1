package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

// hasTask reports whether the default queue holds task id.
func hasTask(t *testing.T, ins *asynq.Inspector, id string) bool {
	t.Helper()
	_, err := ins.GetTaskInfo("default", id)
	return err == nil
}

// startReplicas runs n replicas (r1, r2, …) and waits until status lists
// them all.
func startReplicas(t *testing.T, e *cliEnv, n int) []*proc {
	t.Helper()
	var ps []*proc
	var want []string
	for i := range n {
		id := "r" + string(rune('1'+i))
		want = append(want, id)
		ps = append(ps, start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id))
	}
	waitLive(t, e, 30*time.Second, want, "at start", ps...)
	return ps
}

// waitLive waits until status lists exactly the replicas want as live (ps are
// the replicas, whose logs are shown if it does not).
func waitLive(t *testing.T, e *cliEnv, timeout time.Duration, want []string, when string, ps ...*proc) {
	t.Helper()
	var got []string
	var last result
	testenv.Eventually(t, timeout, func() bool {
		var st statusJSON
		if last = e.run("status", "--json"); last.code != 0 || json.Unmarshal([]byte(last.stdout), &st) != nil {
			return false
		}
		got = got[:0]
		for _, r := range st.Replicas {
			if r.State == "live" {
				got = append(got, r.ID)
			}
		}
		return slices.Equal(got, want)
	}, "%s: status lists live replicas %v, want %v\n%v", when, lazy(func() string { return fmt.Sprint(got) }), want, lazy(func() string {
		out := last.String()
		for _, p := range ps {
			out += "\nreplica log:\n" + p.Stderr()
		}
		return out
	}))
}

// lazy is a message part computed when it is printed.
type lazy func() string

func (l lazy) String() string { return l() }

// TestRunMembershipAfterNATSRestart: the replicas bucket is on file, so a
// NATS restart keeps it; status lists the replicas again within a few
// heartbeats, while the entry keeps firing.
func TestRunMembershipAfterNATSRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	ps := startReplicas(t, e, 2)
	ins := inspector(t, e.redis.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "no tasks fired")

	e.nats.Restart(t)
	restarted := time.Now()
	waitLive(t, e, 30*time.Second, []string{"r1", "r2"}, "after the NATS restart", ps...)
	t.Logf("status lists both replicas %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
	before := len(pendingTasks(t, ins, "default"))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= before+2 }, "no tasks fired after the restart")
	for _, p := range ps {
		if n := strings.Count(p.Stderr(), "replicas bucket is gone"); n > 1 {
			t.Errorf("the lost bucket was logged %d times:\n%s", n, p.Stderr())
		}
		if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("run exited %d\n%s", code, p.Stderr())
		}
	}
}

// TestRunForgedFiresIgnored: a client publishes fired events for a tick two
// seconds ahead, one a few seconds ahead and the year 2100 on the activity
// subject of an entry two replicas fire; the entry keeps firing every
// second, and a replica's relay reports the forgeries that took a genuine
// tick's id.
func TestRunForgedFiresIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	ps := startReplicas(t, e, 2)
	ins := inspector(t, e.redis.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "no tasks fired")

	js := e.nats.JetStream(t)
	forge := func(tick int64) {
		t.Helper()
		m := &nats.Msg{Subject: "cronstream.fire.tick", Data: []byte(`{"forged":true}`), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, "fire:tick:"+strconv.FormatInt(tick, 10))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Two seconds ahead, not one: a forgery published after its tick's
	// genuine event is the duplicate itself, and the relay has nothing to
	// report (a busy machine can take the last fraction of a second
	// before the tick).
	next := time.Now().Unix() + 2
	forge(next)
	forge(next + 3)
	forge(4102444800)
	from := time.Unix(next, 0)
	to := from.Add(8 * time.Second)
	testenv.Eventually(t, 30*time.Second, func() bool { return hasTask(t, ins, "cronstream:tick:"+to.UTC().Format(time.RFC3339)) },
		"the tick of %s to fire", to.Format(time.TimeOnly))
	for at := from; !at.After(to); at = at.Add(time.Second) {
		if !hasTask(t, ins, "cronstream:tick:"+at.UTC().Format(time.RFC3339)) {
			t.Errorf("tick %s never fired", at.Format(time.TimeOnly))
		}
	}
	// Forgeries are logged once a minute: the first one names its id.
	testenv.Eventually(t, 30*time.Second, func() bool {
		logs := ps[0].Stderr() + ps[1].Stderr()
		return strings.Contains(logs, "a forgery") && strings.Contains(logs, `"id":"fire:tick:`+strconv.FormatInt(next, 10)+`"`)
	}, "no relay reported the forgery of %s", time.Unix(next, 0).Format(time.TimeOnly))
	for _, p := range ps {
		if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("run exited %d\n%s", code, p.Stderr())
		}
	}
}

// TestRunMembershipAfterNATSClusterRestart: every node of a 3-node NATS
// cluster stops and starts again (the R3 replicas bucket lives in memory,
// so its heartbeats are gone); two replicas' heartbeats come back, status
// lists both, and the entry keeps firing.
func TestRunMembershipAfterNATSClusterRestart(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartNATSCluster(t, 3)
	rd := testenv.StartRedis(t)
	e := &cliEnv{t: t, redis: rd, vars: append(baseEnv(), "CRONSTREAM_NATS="+cluster.URLs(), "CRONSTREAM_REDIS="+rd.URL)}
	e.ok("streams", "apply", "--replicas", "3")
	e.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	var ps []*proc
	for _, id := range []string{"r1", "r2"} {
		ps = append(ps, start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replicas", "3", "--replica-id", id))
	}
	waitLive(t, e, 60*time.Second, []string{"r1", "r2"}, "at start", ps...)
	ins := inspector(t, rd.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "no tasks fired")

	cluster.RestartAll(t)
	restarted := time.Now()
	waitLive(t, e, 60*time.Second, []string{"r1", "r2"}, "after the NATS cluster restart", ps...)
	t.Logf("status lists both replicas %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
	before := len(pendingTasks(t, ins, "default"))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= before+2 }, "no tasks fired after the restart")
	for _, p := range ps {
		if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			t.Errorf("run exited %d\n%s", code, p.Stderr())
		}
	}
}
