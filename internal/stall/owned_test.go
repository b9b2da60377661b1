package stall

import (
	"context"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// TestDetectorChecksOwnedShards: with ownership, a replica's detector
// checks the entries of the shards it owns only (their owner checks the
// others, and ownership reports shards without one): of two entries
// stuck a minute, in two queues, only the one in an owned shard is late
// here, and it is once the shard is owned.
func TestDetectorChecksOwnedShards(t *testing.T) {
	r := testenv.StartRedis(t)
	store := taskstate.New(r.Client(t))
	names := events.MustNames("stallown")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	owned := map[events.Shard]bool{events.ShardOfEntry("mine", "a"): true}
	d, err := New(Config{Watermarks: store, Projection: unusedProjection{}, Names: names, LateAfter: 10 * time.Second,
		Now: func() time.Time { return now }, Owns: func(s events.Shard) bool { return owned[s] }})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, queue string }{{"a", "mine"}, {"b", "theirs"}} {
		d.apply(changeOf(state(t, events.Entry{ID: c.id, Cron: "@every 1s", Options: events.Options{Queue: c.queue}}, now.Add(-time.Hour))))
		tick := now.Add(-time.Minute)
		if err := store.SeedWatermark(ctx, names.Prefix(), c.queue, c.id, tick, schedule.TaskID(names.Prefix(), c.id, tick), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	d.check(ctx)
	late := d.Late(0)
	if len(late) != 1 || late[0].Entry != "a" {
		t.Fatalf("late %+v, want a alone (b's shard is another replica's)", late)
	}
	owned[events.ShardOfEntry("theirs", "b")] = true
	d.check(ctx)
	if late := d.Late(0); len(late) != 2 {
		t.Errorf("late %+v once both shards are owned, want a and b", late)
	}
	d.wg.Wait()
}

// changeOf is st's registration as the projection hands it over.
func changeOf(st projector.State) projector.Change {
	return projector.Change{ID: st.Entry.ID, New: &st, Seq: st.Revision, Time: st.Time}
}
