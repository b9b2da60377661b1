package taskstate

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestTaskStatesMatchInspector: TaskStates reads the state asynq's
// Inspector shows for each task, and gone for a task that does not exist.
func TestTaskStatesMatchInspector(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opt := asynq.RedisClientOpt{Addr: r.Addr, DB: r.DB, Password: r.Options().Password, Username: r.Options().Username}
	client := asynq.NewClient(opt)
	defer client.Close()
	ins := asynq.NewInspector(opt)
	defer ins.Close()

	enqueue := func(q, id string, opts ...asynq.Option) {
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("t", nil), append(opts, asynq.Queue(q), asynq.TaskID(id))...); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("a", "p")
	enqueue("a", "s", asynq.ProcessIn(time.Hour))
	enqueue("b", "x")
	if err := ins.ArchiveTask("b", "x"); err != nil {
		t.Fatal(err)
	}
	refs := []TaskRef{{"a", "p"}, {"a", "s"}, {"b", "x"}, {"b", "p"}, {"nope", "nope"}}
	got, err := New(r.Client(t)).TaskStates(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{StatePending, StateScheduled, StateArchived, StateGone, StateGone}
	for i, ref := range refs[:3] {
		info, err := ins.GetTaskInfo(ref.Queue, ref.ID)
		if err != nil || info.State.String() != got[i] {
			t.Errorf("%v: TaskStates says %s, the Inspector %v (%v)", ref, got[i], info, err)
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%v: state %s, want %s", refs[i], got[i], want[i])
		}
	}
}
