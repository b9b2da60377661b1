package scheduler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestMaxFiresAcrossReplicas: three replicas, one killed mid-run, fire two
// entries limited to a number of fires. Each creates exactly that many
// tasks and no more; re-sending the entry with the same limit (another
// field changed) does not restart the count, changing the limit does.
// Redis loses all its data (FLUSHALL) while they run: the counts are
// rebuilt from the activity stream and no tick fires beyond the limit.
func TestMaxFiresAcrossReplicas(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a 30 s run of three replicas (runs without -short, as in CI)")
	}
	e := newEnv(t)
	limited := func(n int) func(*events.Entry) { return func(en *events.Entry) { en.MaxFires = n } }
	e.put(every("lim", "@every 1s", limited(5)), every("flush", "@every 1s", limited(8)))
	o := nodeOpts{}
	r1 := e.startNode("r1", o)
	r2 := e.startNode("r2", o)
	r3 := e.startNode("r3", o)

	fired := func(entry string) int {
		l := ledgers(e.readActivity())[entry]
		if l == nil {
			return 0
		}
		for s, n := range l.fired {
			if n > 1 {
				t.Errorf("%s: tick %s fired %d times", entry, fmtUnix(s), n)
			}
		}
		return len(l.fired)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return fired("lim") >= 2 }, "lim to fire twice")
	r1.crash()

	// The loss comes once flush fired a few times, with nothing waiting in
	// the outbox (a record lost there is a fire the stream never hears of:
	// docs/design.md INV-max-fires).
	testenv.Eventually(t, 20*time.Second, func() bool { return fired("flush") >= 4 }, "flush to fire four times")
	outbox := taskstate.Own(testPrefix, "default").Outbox()
	testenv.Eventually(t, 10*time.Second, func() bool {
		c := context.Background()
		err := e.rc.Watch(c, func(tx *redis.Tx) error {
			if n, err := tx.XLen(c, outbox).Result(); err != nil || n != 0 {
				return errors.New("outbox not empty")
			}
			_, err := tx.TxPipelined(c, func(p redis.Pipeliner) error { return p.FlushAll(c).Err() })
			return err
		}, outbox)
		return err == nil
	}, "Redis to be flushed with an empty outbox")

	testenv.Eventually(t, 20*time.Second, func() bool { return fired("lim") >= 5 && fired("flush") >= 8 }, "both entries to reach their limits")
	// Another field, the same limit: the count goes on.
	e.put(every("lim", "@every 1s", limited(5), func(en *events.Entry) { en.Owner = "ops" }))
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	if n := fired("lim"); n != 5 {
		t.Fatalf("lim fired %d ticks after the same limit was sent again, want 5", n)
	}
	// A new limit counts afresh.
	changed := e.put(every("lim", "@every 1s", limited(3), func(en *events.Entry) { en.Owner = "ops" }))
	testenv.Eventually(t, 20*time.Second, func() bool { return fired("lim") >= 8 }, "lim to fire its new limit")
	waitUntil(t, time.Now, time.Now().Add(3*time.Second))
	r2.stop()
	r3.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	if n := fired("lim"); n != 8 {
		t.Errorf("lim fired %d ticks, want 5 then 3", n)
	}
	if n := fired("flush"); n != 8 {
		t.Errorf("flush fired %d ticks across the data loss, want its limit of 8", n)
	}
	if c := r2.counts().Completed + r3.counts().Completed; c == 0 {
		t.Error("no replica found an entry completed")
	}
	under := 0
	for _, a := range e.readActivity() {
		if a.Type == events.TypeEntryFired && a.Fired.Entry == "lim" && a.Fired.Revision >= changed {
			under++
		}
	}
	if under != 3 {
		t.Errorf("lim fired %d ticks under its new limit, want 3", under)
	}
}

// TestMaxFiresAcrossQueueMove: the count moves with a queue handover. An
// entry limited to 4 fires moves to another queue after 2: it fires 2 more
// there, and the count in the new slot says 4.
func TestMaxFiresAcrossQueueMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	en := every("mv", "@every 1s", inQueue("alpha"), func(en *events.Entry) { en.MaxFires = 4 })
	e.put(en)
	// With the history, as a replica runs: the entry's shard in the new
	// queue is taken over (by this replica, here) after the move, not
	// followed live, and the old queue is closed from the history.
	a := e.startNode("a", nodeOpts{})
	ticks := func() int { return len(e.entryTicks("mv")) }
	testenv.Eventually(t, 20*time.Second, func() bool { return ticks() >= 2 }, "mv to fire in alpha")
	e.put(every("mv", "@every 1s", inQueue("beta"), func(en *events.Entry) { en.MaxFires = 4 }))
	testenv.Eventually(t, 20*time.Second, func() bool { return a.counts().Completed > 0 }, "mv to complete in beta")
	waitUntil(t, time.Now, time.Now().Add(2*time.Second))
	a.stop()
	if n := ticks(); n != 4 {
		t.Errorf("mv created %d tasks across the move, want 4", n)
	}
	c, ok, err := e.store.FireCount(context.Background(), testPrefix, "beta", "mv")
	if err != nil || !ok || c.Count != 4 {
		t.Errorf("count in beta: %+v %t %v", c, ok, err)
	}
}

// TestMaxFiresCountBeyondRetention: Redis loses its data after the
// activity stream (a small one, here limited in messages) dropped the
// first fired events of a limited entry. The count cannot be rebuilt: the
// entry is made completed with its count unknown (counted, logged) and
// fires nothing, until its max_fires is set to another value, which counts
// afresh. An entry whose schedule had no tick in the dropped span is
// rebuilt as usual.
func TestMaxFiresCountBeyondRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := testenv.Context(t, 2*time.Minute)
	s, err := e.js.Stream(c, testNames.ActivityStream())
	if err != nil {
		t.Fatal(err)
	}
	small := s.CachedInfo().Config
	small.MaxMsgs = 15
	if _, err := e.js.UpdateStream(c, small); err != nil {
		t.Fatal(err)
	}
	limited := func(n int) func(*events.Entry) { return func(en *events.Entry) { en.MaxFires = n } }
	rev := e.put(every("lim", "@every 1s", limited(100)))
	e.put(every("noise", "@every 1s"), every("later", "@every 1s", limited(3), func(en *events.Entry) { en.StartAt = time.Now().Add(time.Hour) }))
	o := nodeOpts{}
	r1 := e.startNode("r1", o)
	revTime := func() time.Time {
		m, err := e.js.Stream(c, testNames.ConfigStream())
		if err != nil {
			t.Fatal(err)
		}
		msg, err := m.GetMsg(c, rev)
		if err != nil {
			t.Fatal(err)
		}
		return msg.Time
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		info, err := s.Info(c)
		return err == nil && len(e.entryTicks("lim")) >= 3 && info.State.FirstSeq > 1 && info.State.FirstTime.After(revTime.Add(2*time.Second))
	}, "the activity stream to drop lim's first fires")
	r1.stop()
	e.waitOutboxEmpty(10*time.Second, "default")
	if err := e.rc.FlushAll(c).Err(); err != nil {
		t.Fatal(err)
	}

	r2 := e.startNode("r2", o)
	testenv.Eventually(t, 20*time.Second, func() bool { return r2.counts().FireCountUnknown == 1 }, "r2 to find lim's count unknown")
	fc, ok, err := e.store.FireCount(c, testPrefix, "default", "lim")
	if err != nil || !ok || !fc.Unknown() || fc.Since != rev {
		t.Fatalf("lim's counter %+v %t %v: want unknown at revision %d", fc, ok, err, rev)
	}
	if fc, ok, err := e.store.FireCount(c, testPrefix, "default", "later"); err != nil || ok && fc.Unknown() {
		t.Errorf("later's counter %+v %t %v: unknown, though it had no tick in the dropped span", fc, ok, err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.entryTicks("noise")) >= 3 }, "noise to fire after the loss")
	if n := len(e.entryTicks("lim")); n != 0 {
		t.Fatalf("lim created %d tasks with its count unknown", n)
	}
	// A new limit counts afresh.
	e.put(every("lim", "@every 1s", limited(2)))
	testenv.Eventually(t, 20*time.Second, func() bool { return r2.counts().Completed > 0 && len(e.entryTicks("lim")) == 2 }, "lim to fire its new limit")
	waitUntil(t, time.Now, time.Now().Add(2*time.Second))
	r2.stop()
	if n := len(e.entryTicks("lim")); n != 2 {
		t.Errorf("lim created %d tasks under its new limit, want 2", n)
	}
	if n := r2.counts().FireCountUnknown; n != 1 {
		t.Errorf("%d counts found unknown, want lim's alone", n)
	}
}
