package taskstate

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestDecodeWhatAsynqWrites enqueues with the real asynq v0.26.0 client and
// decodes the stored msg with our codec.
func TestDecodeWhatAsynqWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	client := testenv.AsynqClient(t, rc)

	deadline := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	headers := map[string]string{"source": "cron", "trace": "abc", "empty": ""}
	payload := []byte{0, 1, 2, 0xff}
	info, err := client.Enqueue(asynq.NewTaskWithHeaders("report:daily", payload, headers),
		asynq.Queue("critical"), asynq.MaxRetry(7), asynq.Timeout(90*time.Second+500*time.Millisecond),
		asynq.Deadline(deadline), asynq.Retention(time.Hour), asynq.Unique(time.Hour))
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	k := Keys("critical")
	raw, err := rc.HGet(ctx, k.Task(info.ID), "msg").Bytes()
	if err != nil {
		t.Fatalf("read msg: %v", err)
	}
	m, err := DecodeTaskMessage(raw)
	if err != nil {
		t.Fatalf("decode asynq's msg: %v", err)
	}
	want := &TaskMessage{
		Type: "report:daily", Payload: payload, ID: info.ID, Queue: "critical", Retry: 7,
		Timeout: 90, Deadline: deadline.Unix(), UniqueKey: k.Unique("report:daily", payload),
		Retention: 3600, Headers: headers,
	}
	assertTaskMessageEqual(t, want, m)
	if got, _ := rc.Get(ctx, want.UniqueKey).Result(); got != info.ID {
		t.Fatalf("unique key %q holds %q, want %q (key schema differs from asynq)", want.UniqueKey, got, info.ID)
	}

	// Defaults, a nil payload and a group.
	info, err = client.Enqueue(asynq.NewTask("agg", nil), asynq.Group("g:1"), asynq.TaskID("fixed-id"))
	if err != nil {
		t.Fatalf("enqueue group: %v", err)
	}
	d := Keys("default")
	raw, err = rc.HGet(ctx, d.Task("fixed-id"), "msg").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	m, err = DecodeTaskMessage(raw)
	if err != nil {
		t.Fatal(err)
	}
	assertTaskMessageEqual(t, &TaskMessage{Type: "agg", ID: "fixed-id", Queue: "default", Retry: 25, Timeout: 1800, GroupKey: "g:1"}, m)
	if n, _ := rc.ZCard(ctx, d.Group("g:1")).Result(); n != 1 {
		t.Fatalf("group key %q has %d members", d.Group("g:1"), n)
	}
	for key, typ := range map[string]string{
		d.Pending(): "none", d.Groups(): "set", AllQueuesKey: "set", k.Pending(): "list",
		d.Unique("agg", nil): "none",
	} {
		if got, _ := rc.Type(ctx, key).Result(); got != typ {
			t.Errorf("TYPE %s = %s, want %s", key, got, typ)
		}
	}
	_ = info
}

// TestInspectorReadsWhatWeWrite writes a task hash by hand with our codec and
// reads it back with asynq's Inspector.
func TestInspectorReadsWhatWeWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	insp := asynq.NewInspectorFromRedisClient(rc)

	for _, queue := range []string{"default", "a:b", "x{y"} {
		k := Keys(queue)
		msg := &TaskMessage{
			Type: "email:send", Payload: []byte(`{"to":"x"}`), ID: "task-1", Queue: queue,
			Retry: 9, Retried: 2, ErrorMsg: "boom", Timeout: 600, Deadline: 1893456000,
			LastFailedAt: 1700000000, Retention: 7200, GroupKey: "",
			Headers: map[string]string{"h1": "v1", "h2": "v2"},
		}
		b, err := EncodeTaskMessage(msg)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		pipe := rc.TxPipeline()
		pipe.SAdd(ctx, AllQueuesKey, queue)
		pipe.HSet(ctx, k.Task(msg.ID), "msg", b, "state", StatePending, "pending_since", now.UnixNano())
		pipe.LPush(ctx, k.Pending(), msg.ID)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		ti, err := insp.GetTaskInfo(queue, msg.ID)
		if err != nil {
			t.Fatalf("queue %q: GetTaskInfo: %v", queue, err)
		}
		if ti.ID != msg.ID || ti.Queue != queue || ti.Type != msg.Type || string(ti.Payload) != string(msg.Payload) ||
			!maps.Equal(ti.Headers, msg.Headers) || ti.State != asynq.TaskStatePending || ti.MaxRetry != 9 ||
			ti.Retried != 2 || ti.LastErr != "boom" || ti.Timeout != 10*time.Minute ||
			!ti.Deadline.Equal(time.Unix(1893456000, 0)) || !ti.LastFailedAt.Equal(time.Unix(1700000000, 0)) ||
			ti.Retention != 2*time.Hour {
			t.Fatalf("queue %q: inspector read %+v", queue, ti)
		}
		qi, err := insp.GetQueueInfo(queue)
		if err != nil {
			t.Fatalf("queue %q: GetQueueInfo: %v", queue, err)
		}
		if qi.Pending != 1 || qi.Size != 1 {
			t.Fatalf("queue %q: queue info %+v", queue, qi)
		}
	}
}
