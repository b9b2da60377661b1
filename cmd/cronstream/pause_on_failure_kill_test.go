package main

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestPauseOnFailureAcrossReplicaKill: three `cronstream run` replicas, an
// entry with --pause-on-failure whose task a real asynq v0.26.0 worker
// fails with no retry left, and the replica that scans the entry's queue
// (the queue's owner: it holds the queue's shard 0) killed with SIGKILL
// before the first failure. The survivors take the queue over: the entry
// is paused by exactly one config event whose note names the archived
// task and its error.
func TestPauseOnFailureAcrossReplicaKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: three replicas and a real asynq worker")
	}
	e := newEnv(t, true)
	ids := []string{"pk1", "pk2", "pk3"}
	ps := map[string]*proc{}
	for _, id := range ids {
		ps[id], _ = startMetricsReplica(t, e, id)
	}
	e.ok("entry", "put", "pfk", "--cron", "@every 2s", "--type", "pfk", "--queue", "pfk", "--max-retry", "0", "--pause-on-failure")
	// The queue's scanner is its owner, the holder of its shard 0.
	var killed string
	testenv.Eventually(t, 30*time.Second, func() bool {
		killed = shardHolder(t, e, events.Shard{Queue: "pfk"})
		return killed != ""
	}, "the queue's shard 0 was never owned")
	ps[killed].stop(syscall.SIGKILL, 10*time.Second)

	opt, err := asynq.ParseRedisURI(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{"pfk": 1}, Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("pfk", func(context.Context, *asynq.Task) error { return errors.New("disk full") })
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	var v entryView
	testenv.Eventually(t, 60*time.Second, func() bool {
		e.okJSON(&v, "entry", "get", "pfk", "--json")
		return v.Paused
	}, "the entry was never paused after %s was killed", killed)
	if !strings.Contains(v.Note, "disk full") || !strings.Contains(v.Note, "pfk") {
		t.Errorf("pause note %q names no task or error", v.Note)
	}
	// Every archive after the first is of a paused entry: no second pause.
	deadline := time.Now().Add(5 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(deadline) }, "")
	var hist []struct {
		Type   string `json:"type"`
		Source string `json:"source"`
	}
	e.okJSON(&hist, "entry", "history", "pfk", "--json")
	paused := 0
	for _, h := range hist {
		if strings.HasPrefix(h.Type, "cronstream.entry.paused") { // gated: .v2
			paused++
			// A replica's events name it as the fires and recoveries do.
			if !strings.HasPrefix(h.Source, "cronstream/") || strings.HasPrefix(h.Source, "cronstream/cli") {
				t.Errorf("the pause's source is %q, want cronstream/<replica id>", h.Source)
			}
		}
	}
	if paused != 1 {
		t.Errorf("%d paused events, want 1: %+v", paused, hist)
	}
	for id, p := range ps {
		if id == killed {
			continue
		}
		if code := p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Errorf("replica %s exited %d:\n%s", id, code, p.Stderr())
		}
	}
}
