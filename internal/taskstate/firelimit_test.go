package taskstate

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// limitedFire is tickFire limited to max fires counted from revision since.
func limitedFire(entry, queue string, tick, prev time.Time, max int, since uint64) Fire {
	f := tickFire(entry, queue, tick, prev)
	f.MaxFires, f.MaxFiresSince = max, since
	return f
}

// TestFireLimitInOneBatch: four consecutive ticks of an entry limited to
// two fires, in one batch beside plain ticks of other entries, create two
// tasks; the third is refused as completed (the watermark stays at the
// second, so the fourth finds it unexpected), on every path of the script.
func TestFireLimitInOneBatch(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	const queue = "limit"
	var want []FireResult
	var wantState map[string]string
	for _, path := range []firePath{pathAuto, pathEach, pathFull} {
		if err := rc.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		s.firePath = path
		fires := []Fire{tickFire("plain-a", queue, tickAt(1), time.Time{})}
		prev := time.Time{}
		for i := 1; i <= 4; i++ {
			fires = append(fires, limitedFire("lim", queue, tickAt(i), prev, 2, 5))
			prev = tickAt(i)
		}
		fires = append(fires, tickFire("plain-b", queue, tickAt(1), time.Time{}))
		got, err := s.FireBatch(ctx, testFences, fires)
		if err != nil {
			t.Fatalf("path %d: %v", path, err)
		}
		wantStatus := []FireStatus{StatusFired, StatusFired, StatusFired, StatusCompleted, StatusWatermarkMismatch, StatusFired}
		for i, r := range got {
			if r.Status != wantStatus[i] {
				t.Fatalf("path %d fire %d: %s, want %s", path, i, r.Status, wantStatus[i])
			}
		}
		if got[3].Fires != 2 || !got[3].Watermark.Equal(tickAt(2)) {
			t.Errorf("path %d: completed fire reports %d fires, watermark %v", path, got[3].Fires, got[3].Watermark)
		}
		if c, ok, err := s.FireCount(ctx, testPrefix, queue, "lim"); err != nil || !ok || c != (FireCount{Since: 5, Count: 2}) {
			t.Errorf("path %d: counter %+v %v %v", path, c, ok, err)
		}
		if n, _ := rc.Exists(ctx, Keys(queue).Task(taskIDFor("lim", tickAt(3)))).Result(); n != 0 {
			t.Errorf("path %d: a task beyond the limit", path)
		}
		state := dumpState(t, rc)
		if path == pathAuto {
			want, wantState = got, state
			continue
		}
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(state, wantState) {
			t.Fatalf("path %d differs from auto:\n%+v\n%+v\n%s\n%s", path, got, want, showState(state), showState(wantState))
		}
	}
	s.firePath = pathAuto
}

// TestFireLimitCountsCreatedTasksOnly: a tick whose task exists, or whose
// unique lock another task holds, creates nothing and does not count; a
// changed limit (another revision) counts afresh.
func TestFireLimitCountsCreatedTasksOnly(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	const queue = "limit2"
	keys := Keys(queue)
	if err := rc.HSet(ctx, keys.Task(taskIDFor("e", tickAt(1))), "msg", "x", "state", "completed").Err(); err != nil {
		t.Fatal(err)
	}
	mustFire(t, s, limitedFire("e", queue, tickAt(1), time.Time{}, 1, 5), StatusAlreadyExists)

	f := limitedFire("e", queue, tickAt(2), tickAt(1), 1, 5)
	f.UniqueTTL, f.DuplicateRecord = time.Minute, record("dup", "e", tickAt(2))
	if err := rc.Set(ctx, keys.Unique(f.Msg.Type, f.Msg.Payload), "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	mustFire(t, s, f, StatusDuplicate)
	if _, ok, _ := s.FireCount(ctx, testPrefix, queue, "e"); ok {
		t.Fatal("a tick that created no task was counted")
	}

	mustFire(t, s, limitedFire("e", queue, tickAt(3), tickAt(2), 1, 5), StatusFired)
	r := mustFire(t, s, limitedFire("e", queue, tickAt(4), tickAt(3), 1, 5), StatusCompleted)
	if r.Fires != 1 {
		t.Errorf("completed with %d fires", r.Fires)
	}
	// Triggers and backfills do not look at the limit, nor move it.
	mustFire(t, s, NewTriggerFire(testPrefix, queue, "e", "req-1", tickAt(4), &TaskMessage{Type: "report:daily", ID: "trig-1"}, record("fired", "e-trig", tickAt(4))), StatusFired)
	mustFire(t, s, NewBackfillFire(testPrefix, queue, "e", tickAt(0), &TaskMessage{Type: "report:daily", ID: taskIDFor("e", tickAt(0))}, record("fired", "e", tickAt(0))), StatusFired)
	if c, _, _ := s.FireCount(ctx, testPrefix, queue, "e"); c != (FireCount{Since: 5, Count: 1}) {
		t.Errorf("counter after trigger and backfill %+v", c)
	}

	// The limit changed at revision 7: counted afresh.
	fences := Fences{ConfigSeq: 12}
	mustFireWith(t, s, fences, limitedFire("e", queue, tickAt(4), tickAt(3), 1, 7), StatusFired)
	mustFireWith(t, s, fences, limitedFire("e", queue, tickAt(5), tickAt(4), 1, 7), StatusCompleted)
	if c, _, _ := s.FireCount(ctx, testPrefix, queue, "e"); c != (FireCount{Since: 7, Count: 1}) {
		t.Errorf("counter after the change %+v", c)
	}
	// A fire from a configuration before the change is refused by the
	// revision fence before its limit is looked at.
	mustFireWith(t, s, Fences{ConfigSeq: 6}, limitedFire("e", queue, tickAt(5), tickAt(4), 3, 5), StatusRevisionFenced)
}

// TestSeedFireCount: seeding only ever raises the counter of a revision and
// never replaces a later revision's.
func TestSeedFireCount(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t)
	ctx := context.Background()
	steps := []struct {
		seed, want FireCount
	}{
		{FireCount{Since: 5, Count: 2}, FireCount{Since: 5, Count: 2}},
		{FireCount{Since: 5, Count: 1}, FireCount{Since: 5, Count: 2}},
		{FireCount{Since: 5, Count: 3}, FireCount{Since: 5, Count: 3}},
		{FireCount{Since: 4, Count: 9}, FireCount{Since: 5, Count: 3}},
		{FireCount{Since: 8, Count: 0}, FireCount{Since: 8, Count: 0}},
	}
	for i, st := range steps {
		got, err := s.SeedFireCount(ctx, testPrefix, "q", "e", st.seed)
		if err != nil || got != st.want {
			t.Errorf("step %d: seeded %+v: %+v %v, want %+v", i, st.seed, got, err, st.want)
		}
	}
	if _, err := s.SeedFireCount(ctx, testPrefix, "q", "e", FireCount{}); err == nil {
		t.Error("a counter without a revision was seeded")
	}
}

// TestFireCounts: the pipelined read gives each counter as FireCount does,
// nothing for an entry without one, and an error for a malformed one.
func TestFireCounts(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	mustFire(t, s, limitedFire("lim", "q-one", tickAt(1), time.Time{}, 3, 5), StatusFired)
	if _, err := s.SeedFireCount(ctx, testPrefix, "q-two", "other", FireCount{Since: 9, Count: 4}); err != nil {
		t.Fatal(err)
	}
	refs := []FireCountRef{{"q-one", "lim"}, {"q-one", "none"}, {"q-two", "other"}}
	counts, ok, err := s.FireCounts(ctx, testPrefix, refs)
	if err != nil {
		t.Fatal(err)
	}
	want := []FireCount{{Since: 5, Count: 1}, {}, {Since: 9, Count: 4}}
	if !reflect.DeepEqual(counts, want) || !reflect.DeepEqual(ok, []bool{true, false, true}) {
		t.Errorf("counters %+v %v, want %+v [true false true]", counts, ok, want)
	}
	if err := rc.Set(ctx, Own(testPrefix, "q-two").Fires("bad"), "x y", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.FireCounts(ctx, testPrefix, []FireCountRef{{"q-two", "bad"}}); err == nil {
		t.Error("a malformed counter read without an error")
	}
}
