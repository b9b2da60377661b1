package asynqcompat_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/asynqcompat"
	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/asynqimport"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestImportedEntriesTakenOver: a registration that a real asynq scheduler
// runs is imported under the id this package derives for the same
// registration, so a program moved from asynq's Scheduler to this one
// takes the imported entry over (the owner changes) instead of adding a
// second one.
func TestImportedEntriesTakenOver(t *testing.T) {
	_, js, c := natsEnv(t, "takeover")
	rd := testenv.StartRedis(t)
	rc := rd.Client(t)
	ctx := testCtx(t)
	task := func() *asynq.Task { return asynq.NewTask("invoice:send", []byte(`{"batch":7}`)) }
	opts := []asynq.Option{asynq.Queue("billing"), asynq.MaxRetry(3), asynq.Unique(time.Hour)}

	sch := asynq.NewSchedulerFromRedisClient(rc, &asynq.SchedulerOpts{HeartbeatInterval: time.Second, LogLevel: asynq.FatalLevel})
	if _, err := sch.Register("*/15 * * * *", task(), opts...); err != nil {
		t.Fatal(err)
	}
	if err := sch.Start(); err != nil {
		t.Fatal(err)
	}
	defer sch.Shutdown()
	var r asynqimport.Result
	testenv.Eventually(t, 10*time.Second, func() bool {
		var err error
		r, err = asynqimport.Read(ctx, taskstate.New(rc), asynqimport.Options{})
		return err == nil && len(r.Entries) == 1
	}, "asynq's entry not read")
	imported := r.Entries[0].Entry
	if _, err := configsync.Apply(ctx, c, configsync.MakePlan(nil, []configsync.Config{{Entry: imported}}, "sync", false)); err != nil {
		t.Fatal(err)
	}

	s, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Prefix: "takeover"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Register("*/15 * * * *", task(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if id != imported.ID {
		t.Fatalf("Register derived %q, the import %q", id, imported.ID)
	}
	got := listed(t, c)
	if len(got) != 1 || got[id].Owner != asynqcompat.DefaultSchedulerOwner || !events.SameContent(withOwner(got[id], ""), withOwner(imported, "")) {
		t.Fatalf("after Register: %+v", got)
	}
}

func withOwner(e events.Entry, owner string) events.Entry {
	e.Owner = owner
	return e
}
