package taskstate

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestQueueStatsMatchInspector: QueueStats reads what asynq's Inspector
// shows for the same queue.
func TestQueueStatsMatchInspector(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rc := r.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opt := asynq.RedisClientOpt{Addr: r.Addr, DB: r.DB, Password: r.Options().Password, Username: r.Options().Username}
	client := asynq.NewClient(opt)
	defer client.Close()
	ins := asynq.NewInspector(opt)
	defer ins.Close()

	const q = "stats"
	var ids []string
	for i := 0; i < 3; i++ {
		info, err := client.EnqueueContext(ctx, asynq.NewTask("t", []byte{byte(i)}), asynq.Queue(q))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	if _, err := client.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(q), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := ins.ArchiveTask(q, ids[0]); err != nil {
		t.Fatal(err)
	}
	k := Keys(q)
	now := time.Now()
	for key, v := range map[string]int{k.ProcessedTotal(): 7, k.FailedTotal(): 2, k.Processed(now): 5, k.Failed(now): 1} {
		if err := rc.Set(ctx, key, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ins.PauseQueue(q); err != nil {
		t.Fatal(err)
	}

	got, err := New(rc).QueueStats(ctx, q)
	if err != nil {
		t.Fatalf("QueueStats: %v", err)
	}
	want, err := ins.GetQueueInfo(q)
	if err != nil {
		t.Fatal(err)
	}
	if got.Queue != q || got.Pending != int64(want.Pending) || got.Active != int64(want.Active) || got.Scheduled != int64(want.Scheduled) ||
		got.Retry != int64(want.Retry) || got.Archived != int64(want.Archived) || got.Completed != int64(want.Completed) ||
		got.Processed != int64(want.ProcessedTotal) || got.Failed != int64(want.FailedTotal) ||
		got.ProcessedToday != int64(want.Processed) || got.FailedToday != int64(want.Failed) || got.Paused != want.Paused {
		t.Errorf("QueueStats = %+v\nInspector  = %+v", got, want)
	}
	if got.Pending != 2 || got.Scheduled != 1 || got.Archived != 1 || got.Processed != 7 || !got.Paused {
		t.Errorf("QueueStats = %+v", got)
	}

	// A queue nobody used: zeros, not an error.
	empty, err := New(rc).QueueStats(ctx, "unused")
	if err != nil || empty != (QueueStats{Queue: "unused"}) {
		t.Errorf("QueueStats(unused) = %+v, %v", empty, err)
	}
}
