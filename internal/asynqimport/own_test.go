package asynqimport

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/replicatest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestReadLeavesOutOwnLists: a running replica lists the entries it holds
// under its own scheduler id, beside a real asynq scheduler and a list
// under the id asynq gives itself on a host named "cronstream". Read
// imports only asynq's entries, naming the replica's list as cronstream's
// own; the cutover waits for asynq's schedulers alone, while the replica
// keeps listing.
func TestReadLeavesOutOwnLists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	rc := testenv.StartRedis(t).Client(t)
	store := taskstate.New(rc)
	names := events.MustNames("imp")
	replicatest.Start(t, replica.Config{NATSURL: ns.URL(), Redis: rc, Names: names, ReplicaID: "imp-1", SkipRedisChecks: true})
	client := events.NewClient(ns.JetStream(t), names)
	for _, e := range []events.Entry{
		{ID: "ours-hourly", Cron: "@hourly", Task: events.Task{Type: "ours"}},
		{ID: "ours-daily", Cron: "0 9 * * *", Task: events.Task{Type: "ours"}},
	} {
		if _, err := client.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	sch := asynq.NewSchedulerFromRedisClient(rc, &asynq.SchedulerOpts{HeartbeatInterval: time.Second, LogLevel: asynq.FatalLevel})
	if _, err := sch.Register("0 8 * * *", asynq.NewTask("report", nil)); err != nil {
		t.Fatal(err)
	}
	if err := sch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sch.Shutdown) // a second Shutdown does nothing
	// asynq's id on a host named "cronstream": <host>:<pid>:<uuid>.
	onHost := "cronstream:4321:" + uuid.NewString()
	if err := store.WriteSchedulerEntries(ctx, onHost, []taskstate.SchedulerEntry{{ID: uuid.NewString(), Spec: "@every 1h", TaskType: "host-named"}}, time.Minute); err != nil {
		t.Fatal(err)
	}

	ownID := taskstate.ReplicaSchedulerID(names.Prefix(), "imp-1")
	testenv.Eventually(t, 20*time.Second, func() bool {
		ls, err := store.ListSchedulers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		listed := 0
		for _, l := range ls {
			if l.Exists && (l.ID == ownID && len(l.Entries) == 2 || l.ID != ownID && len(l.Entries) == 1) {
				listed++
			}
		}
		return listed == 3
	}, "the replica and the asynq schedulers did not list their entries")

	r, err := Read(ctx, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range r.Entries {
		types = append(types, e.Entry.Task.Type)
	}
	slices.Sort(types)
	if !slices.Equal(types, []string{"host-named", "report"}) || !slices.Equal(r.Own, []string{ownID}) || len(r.Schedulers) != 2 || !slices.Contains(r.Schedulers, onHost) {
		t.Fatalf("read task types %v from schedulers %v, own %v; want asynq's two, the replica's list own", types, r.Schedulers, r.Own)
	}

	// Cutover: the operator stops both asynq schedulers when told to; the
	// replica's list stays and must not hold the cutover up.
	said := make(chan string, 16)
	c := Cutover{Store: store, Poll: 50 * time.Millisecond, Settle: 100 * time.Millisecond, Say: func(msg string) {
		said <- msg
		if strings.HasPrefix(msg, "watching ") {
			sch.Shutdown()
			if err := store.ClearSchedulerEntries(context.WithoutCancel(ctx), onHost); err != nil {
				t.Error(err)
			}
		}
	}}
	runCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	hs, err := c.Run(runCtx, r)
	close(said)
	if err != nil || len(hs) != 2 {
		var msgs []string
		for m := range said {
			msgs = append(msgs, m)
		}
		t.Fatalf("cutover: %d handovers, %v; said:\n%s", len(hs), err, strings.Join(msgs, "\n"))
	}
}
