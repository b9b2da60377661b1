package recoverer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// blockingStore holds the first RecoverBatch call until released, then
// runs it for real.
type blockingStore struct {
	*taskstate.Store
	entered, release chan struct{}
	calls            atomic.Int32
	firstDone        atomic.Bool
}

func (b *blockingStore) RecoverBatch(ctx context.Context, prefix, queue string, cutoff time.Time, ds []taskstate.Decision) ([]taskstate.Outcome, error) {
	if b.calls.Add(1) == 1 {
		close(b.entered)
		<-b.release
		defer b.firstDone.Store(true)
	}
	return b.Store.RecoverBatch(ctx, prefix, queue, cutoff, ds)
}

// TestStopFinishesTheBatchInFlight: Stop during a batch lets that batch
// complete (all of it moved, with its records), starts no further batch,
// and returns only after the loop ended. Stop again, and Start after Stop,
// are harmless.
func TestStopFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q, n, batch = "stopq", 20, 5
	k := taskstate.Keys(q)
	pipe := rc.Pipeline()
	for i := range n {
		id := fmt.Sprintf("t%02d", i)
		msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "w", ID: id, Queue: q, Retry: 25, Timeout: 1800})
		if err != nil {
			t.Fatal(err)
		}
		pipe.HSet(ctx, k.Task(id), "msg", msg, "state", taskstate.StateActive)
		pipe.LPush(ctx, k.Active(), id)
		pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: id})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	store := &blockingStore{Store: taskstate.New(rc), entered: make(chan struct{}), release: make(chan struct{})}
	r, err := New(Config{store: store, Names: events.MustNames("rv"), ReplicaID: "rep1", Queues: []string{q},
		Batch: batch, Interval: time.Hour, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Start(context.Background())
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch never started")
	}
	stopped := make(chan struct{})
	go func() {
		_ = r.Stop(context.Background())
		close(stopped)
	}()
	testenv.Eventually(t, 5*time.Second, r.stopping, "Stop signals the loop")
	select {
	case <-stopped:
		t.Fatal("Stop returned while a batch was in flight")
	default:
	}
	close(store.release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the batch")
	}
	if !store.firstDone.Load() {
		t.Fatal("Stop returned before the batch finished")
	}
	if c := store.calls.Load(); c != 1 {
		t.Fatalf("%d batches ran, want 1", c)
	}
	if got, _ := rc.ZCard(ctx, k.Retry()).Result(); got != batch {
		t.Fatalf("%d tasks moved, want the whole first batch of %d", got, batch)
	}
	if got, _ := rc.ZCard(ctx, k.Lease()).Result(); got != n-batch {
		t.Fatalf("%d tasks left in the lease set, want %d", got, n-batch)
	}
	if got := r.Stats()[q].Retried; got != batch {
		t.Fatalf("stats: %d retried", got)
	}
	recs, err := taskstate.New(rc).ReadOutbox(ctx, "rv", q, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	evs := 0
	for _, rec := range recs {
		parts, err := events.SplitEvents(bytes.TrimPrefix(rec.Data, []byte(outbox.BatchRecordTag)))
		if err != nil {
			t.Fatal(err)
		}
		evs += len(parts)
	}
	if evs != batch {
		t.Fatalf("%d events in the outbox, want %d", evs, batch)
	}

	_ = r.Stop(context.Background())  // again: no panic, no wait
	_ = r.Start(context.Background()) // after Stop: runs nothing
	_ = r.Stop(context.Background())
	if c := store.calls.Load(); c != 1 {
		t.Fatalf("a batch ran after Stop (%d calls)", c)
	}
	idle, err := New(Config{store: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Stop(context.Background()); err != nil { // never started: returns at once
		t.Fatal(err)
	}
}

// hangingStore holds every RecoverBatch call until its context ends; left
// says a call has returned.
type hangingStore struct {
	*taskstate.Store
	entered chan struct{}
	once    sync.Once
	left    atomic.Bool
}

func (h *hangingStore) RecoverBatch(ctx context.Context, _, _ string, _ time.Time, _ []taskstate.Decision) ([]taskstate.Outcome, error) {
	h.once.Do(func() { close(h.entered) })
	<-ctx.Done()
	h.left.Store(true)
	return nil, ctx.Err()
}

// TestStopBoundedByContext: a batch that does not finish within Stop's
// context is cancelled (the passes run on a context Stop cancels), and Stop
// returns the context's error once the loop has ended.
func TestStopBoundedByContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := testenv.StartRedis(t).Client(t)
	const q = "hangq"
	k := taskstate.Keys(q)
	msg, err := taskstate.EncodeTaskMessage(&taskstate.TaskMessage{Type: "w", ID: "t1", Queue: q, Retry: 25, Timeout: 1800})
	if err != nil {
		t.Fatal(err)
	}
	pipe := rc.Pipeline()
	pipe.HSet(ctx, k.Task("t1"), "msg", msg, "state", taskstate.StateActive)
	pipe.LPush(ctx, k.Active(), "t1")
	pipe.ZAdd(ctx, k.Lease(), redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: "t1"})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	store := &hangingStore{Store: taskstate.New(rc), entered: make(chan struct{})}
	r, err := New(Config{store: store, Names: events.MustNames("rv"), ReplicaID: "rep1", Queues: []string{q},
		Interval: time.Hour, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch never started")
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := r.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the context's deadline", err)
	}
	if !store.left.Load() {
		t.Fatal("Stop returned before the cancelled batch did")
	}
}

func TestNewRequiresRedis(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Redis") {
		t.Fatalf("New without Redis: %v", err)
	}
}
