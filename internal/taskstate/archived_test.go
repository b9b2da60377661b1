package taskstate

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestHasBusyTask: tasks enqueued by asynq, pending or scheduled, count as
// busy for their id prefix; another prefix, a glob-looking prefix taken
// literally, and an archived task do not.
func TestHasBusyTask(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rc := r.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: r.Addr, DB: r.DB, Password: r.Options().Password, Username: r.Options().Username})
	defer client.Close()
	enqueue := func(id string, opts ...asynq.Option) {
		t.Helper()
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("t", nil), append(opts, asynq.Queue("bq"), asynq.TaskID(id))...); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("cs:pend:1")
	enqueue("cs:sch*d:1", asynq.ProcessIn(time.Hour))
	s := New(rc)
	for _, c := range []struct {
		prefix string
		want   bool
	}{
		{"cs:pend:", true}, {"cs:sch*d:", true}, {"cs:other:", false}, {"cs:s*", false}, {"cs:pe?d:", false},
	} {
		got, err := s.HasBusyTask(ctx, "bq", c.prefix)
		if err != nil || got != c.want {
			t.Errorf("HasBusyTask(%q) = %v, %v; want %v", c.prefix, got, err, c.want)
		}
	}
	// Archived: no longer busy.
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: r.Addr, DB: r.DB, Password: r.Options().Password, Username: r.Options().Username})
	defer ins.Close()
	if err := ins.ArchiveTask("bq", "cs:pend:1"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.HasBusyTask(ctx, "bq", "cs:pend:"); err != nil || got {
		t.Errorf("an archived task counts as busy: %v, %v", got, err)
	}
}
