package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// TestSmallBatchesKeepEachFireIntact: a fire pass hands each batch's
// buffers (its fires, results and fired records; in taskstate its encoded
// messages and key names) on to the batches after it. With batches of 7
// fires, 3 in flight and two queues, every pass passes them on many times:
// each fired event must still name its own entry, tick, queue and task,
// and each task in Redis carry its own entry's message.
func TestSmallBatchesKeepEachFireIntact(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 60
	queueOf := func(i int) string {
		if i%2 == 1 {
			return "other"
		}
		return "default"
	}
	entries := make([]events.Entry, n)
	queues := map[string]string{}
	for i := range entries {
		id := fmt.Sprintf("b%02d", i)
		queues[id] = queueOf(i)
		entries[i] = every(id, "@every 1s", func(en *events.Entry) { en.Options.Queue = queueOf(i) })
	}
	e.put(entries...)
	mt := newManualTime(t)
	mt.startNode(e, "n1", nodeOpts{sched: func(c *scheduler.Config) { c.Batch, c.Parallel = 7, 3 }})
	mt.advance(3 * time.Second) // three ticks of every entry
	e.waitActivity(3*n, 45*time.Second)

	fired := 0
	for _, a := range e.readActivity() {
		if a.Type != events.TypeEntryFired {
			continue
		}
		fired++
		f := a.Fired
		q, known := queues[f.Entry]
		switch {
		case !known:
			t.Fatalf("fired event %s names entry %q, which is not registered", a.MsgID, f.Entry)
		case a.MsgID != events.FiredEventID(f.Entry, f.ScheduledAt):
			t.Fatalf("fired event %s names entry %s tick %s", a.MsgID, f.Entry, f.ScheduledAt)
		case f.TaskID != schedule.TaskID(testPrefix, f.Entry, f.ScheduledAt):
			t.Fatalf("fired event %s names task %s", a.MsgID, f.TaskID)
		case f.Queue != q:
			t.Fatalf("fired event %s names queue %s, want %s", a.MsgID, f.Queue, q)
		}
		raw, err := e.rc.HGet(context.Background(), taskstate.Keys(q).Task(f.TaskID), "msg").Bytes()
		if err != nil {
			t.Fatalf("task %s of fired event %s: %v", f.TaskID, a.MsgID, err)
		}
		msg, err := taskstate.DecodeTaskMessage(raw)
		if err != nil {
			t.Fatalf("task %s: %v", f.TaskID, err)
		}
		if msg.ID != f.TaskID || msg.Queue != q || msg.Type != "tick:"+f.Entry || string(msg.Payload) != `{"id":"`+f.Entry+`"}` {
			t.Fatalf("task %s holds the message of task %s (queue %s, type %s, payload %s)", f.TaskID, msg.ID, msg.Queue, msg.Type, msg.Payload)
		}
	}
	if fired < 3*n {
		t.Fatalf("%d fired events, want at least %d", fired, 3*n)
	}
}

// TestFarOffBurstPlacedAfterItsPasses: a burst of entries whose next tick
// is far off (every minute, at second 0) fires in passes of ten, beside
// entries of another queue due every second. The far-off ones are applied
// and placed in the heap only once the burst's backlog is fired; each
// must still fire every minute once, the every-second ones every second
// once, and nothing be skipped.
func TestFarOffBurstPlacedAfterItsPasses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const minutely, secondly = 40, 5
	var entries []events.Entry
	for i := range minutely {
		entries = append(entries, every(fmt.Sprintf("m%02d", i), "0 * * * * *"))
	}
	for i := range secondly {
		entries = append(entries, every(fmt.Sprintf("s%02d", i), "@every 1s", func(en *events.Entry) { en.Options.Queue = "other" }))
	}
	// An entry's first tick is the first after its registration, which
	// comes before the manual clock starts: a minute that begins between
	// the two fires as a catch-up (a slow machine takes seconds here).
	registering := time.Now()
	e.put(entries...)
	registered := time.Now()
	mt := newManualTime(t)
	// No rewrite of asynq's entries in the test's minutes: it too places
	// them (it reads every run), and the test is about the burst's own.
	mt.startNode(e, "n1", nodeOpts{sched: func(c *scheduler.Config) { c.Batch, c.Parallel, c.Visibility = 5, 2, time.Hour }})
	start := mt.now()
	mt.advance(3*time.Minute + 500*time.Millisecond)
	end := mt.now()
	var minutes []time.Time
	unsure := 0 // a minute begun while the entries were registered may fire or not
	for m := registering.Truncate(time.Minute).Add(time.Minute); !m.After(end); m = m.Add(time.Minute) {
		if m.After(registered) {
			minutes = append(minutes, m)
		} else {
			unsure++
		}
	}
	seconds := int(end.Sub(start) / time.Second)
	e.waitActivity(uint64(minutely*len(minutes)+secondly*(seconds-1)), 60*time.Second)
	// The two queues' outboxes publish apart: the count can be reached
	// with default's last fires still in its outbox.
	e.waitOutboxEmpty(30*time.Second, "default", "other")

	fired := map[string]map[time.Time]int{}
	for _, a := range e.readActivity() {
		switch a.Type {
		case events.TypeEntryFired:
			f := a.Fired
			if fired[f.Entry] == nil {
				fired[f.Entry] = map[time.Time]int{}
			}
			fired[f.Entry][f.ScheduledAt.UTC()]++
		case events.TypeEntrySkipped:
			t.Errorf("skipped: %+v", a.Skipped)
		}
	}
	for i := range minutely {
		id := fmt.Sprintf("m%02d", i)
		for _, m := range minutes {
			if n := fired[id][m.UTC()]; n != 1 {
				t.Errorf("%s: tick %s fired %d times, want once", id, m.Format(time.TimeOnly), n)
			}
		}
		for tick := range fired[id] {
			if !tick.After(registering) || tick.After(end) || tick.Second() != 0 {
				t.Errorf("%s fired tick %s, outside %s–%s", id, tick.Format(time.TimeOnly), registering.Format(time.TimeOnly), end.Format(time.TimeOnly))
			}
		}
		if len(fired[id]) < len(minutes) || len(fired[id]) > len(minutes)+unsure {
			t.Errorf("%s fired %d ticks, want %d", id, len(fired[id]), len(minutes))
		}
	}
	for i := range secondly {
		id := fmt.Sprintf("s%02d", i)
		for tick, n := range fired[id] {
			if n != 1 {
				t.Errorf("%s: tick %s fired %d times", id, tick.Format(time.TimeOnly), n)
			}
		}
		if len(fired[id]) < seconds-1 {
			t.Errorf("%s fired %d ticks in %d seconds", id, len(fired[id]), seconds)
		}
	}
}
