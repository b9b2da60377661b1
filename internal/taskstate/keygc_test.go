package taskstate

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestParseEntryKey reads back the queue and entry of every per-entry key,
// whatever the queue name holds, and refuses other keys and other tenants.
func TestParseEntryKey(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", "acme"} {
		for _, queue := range []string{"default", "a:b", "x{y", "}:cronstream:wm:z", ""} {
			own := Own(prefix, queue)
			for _, key := range []string{own.Watermark("e-1"), own.Handover("e-1"), own.HandoverID("e-1"), own.Held("e-1")} {
				q, e, ok := ParseEntryKey(prefix, key)
				if !ok || q != queue || e != "e-1" {
					t.Errorf("ParseEntryKey(%q, %q) = %q, %q, %t; want %q, e-1", prefix, key, q, e, ok, queue)
				}
			}
			for _, key := range []string{own.Fence(), own.Outbox(), own.Trigger("r"), own.FenceID(), own.HeldIndex(), Own("other", queue).Watermark("e-1")} {
				if _, _, ok := ParseEntryKey(prefix, key); ok {
					t.Errorf("ParseEntryKey(%q, %q) accepted a key that is not a per-entry key", prefix, key)
				}
			}
		}
	}
}

// TestAppendKeysMatchNames: the bulk fire path writes key names with the
// Append forms into a reused buffer; they must name the same keys as the
// string forms every other path uses.
func TestAppendKeysMatchNames(t *testing.T) {
	t.Parallel()
	buf := []byte("left over")
	for _, prefix := range []string{"", "acme"} {
		for _, queue := range []string{"default", "a:b", "x{y"} {
			own, keys := Own(prefix, queue), Keys(queue)
			for _, c := range []struct{ got, want string }{
				{string(own.AppendWatermark(buf[:0], "e-1")), own.Watermark("e-1")},
				{string(own.AppendHandover(buf[:0], "e-1")), own.Handover("e-1")},
				{string(keys.AppendTask(buf[:0], "st:e-1:2026-12-03T04:00:00Z")), keys.Task("st:e-1:2026-12-03T04:00:00Z")},
			} {
				if c.got != c.want {
					t.Errorf("append form %q, string form %q", c.got, c.want)
				}
			}
		}
	}
}

// TestDeleteRemovedEntryKeys scans the per-entry keys of one tenant and
// deletes those of one entry: a key changed since the scan (a
// re-registration fired) and history events after the removal are kept.
func TestDeleteRemovedEntryKeys(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	testDeleteRemovedEntryKeys(t, s, rc)
}

// TestDeleteRemovedEntryKeysCluster does the same on a three-master Redis
// Cluster: the scan visits every master.
func TestDeleteRemovedEntryKeysCluster(t *testing.T) {
	t.Parallel()
	cc := testenv.StartRedisCluster(t).Client(t)
	testDeleteRemovedEntryKeys(t, New(cc), cc)
}

func testDeleteRemovedEntryKeys(t *testing.T, s *Store, rc redis.UniversalClient) {
	ctx := context.Background()
	removedAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	queues := []string{"default", "critical", "a:b", "x{y"}
	var goneKeys []string
	for i, q := range queues {
		own := Own("acme", q)
		goneKeys = append(goneKeys, own.Watermark("gone"), own.Handover("gone"))
		rc.Set(ctx, own.Watermark("gone"), fmt.Sprintf("%d task-%d", removedAt.UnixMilli()-int64(i), i), 0)
		rc.Set(ctx, own.Handover("gone"), fmt.Sprintf("%d out", 10+i), 0)
		rc.Set(ctx, own.Watermark("live"), "1 t", 0)
		rc.Set(ctx, own.Watermark("changed"), "1 t", 0)
		rc.Set(ctx, Own("other", q).Watermark("gone"), "1 t", 0) // another tenant's
		rc.Set(ctx, own.Fence(), "7", 0)                         // not per entry
	}
	history := SchedulerHistoryKey("gone")
	rc.ZAdd(ctx, history, redis.Z{Score: float64(removedAt.Unix() - 60), Member: "before"})
	// Restore proposals left by entries removed while Redis restored them.
	propose := func(q, entry string, tick time.Time) {
		t.Helper()
		if _, err := s.ProposeRestore(ctx, "acme", q, entry, tick, "t", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	propose(queues[0], "gone", removedAt.Add(time.Second))
	propose(queues[2], "gone", removedAt.Add(time.Second))
	propose(queues[0], "live", removedAt.Add(time.Second))
	propose(queues[1], "changed", removedAt)
	const goneProposals = 2

	notLive := func(entry string) bool { return entry != "live" }
	keys, err := s.ScanEntryKeys(ctx, "acme", notLive, 0)
	if err != nil {
		t.Fatal(err)
	}
	byEntry := map[string][]EntryKey{}
	var found []string
	for _, k := range keys {
		byEntry[k.Entry] = append(byEntry[k.Entry], k)
		found = append(found, k.Key)
	}
	if n := len(byEntry["gone"]); n != 2*len(queues)+goneProposals {
		t.Fatalf("scan found %d keys of gone, want %d: %v", n, 2*len(queues)+goneProposals, found)
	}
	if len(byEntry["live"]) != 0 || len(byEntry["changed"]) != len(queues)+1 || len(byEntry) != 2 {
		t.Fatalf("scan found %v", found)
	}
	if limited, err := s.ScanEntryKeys(ctx, "acme", notLive, 3); err != nil || len(limited) > 3 {
		t.Fatalf("scan with limit 3 returned %d keys, %v", len(limited), err)
	}

	n, err := s.DeleteRemovedEntryKeys(ctx, byEntry["gone"], removedAt)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(goneKeys)+goneProposals+1 {
		t.Errorf("deleted %d keys, want %d", n, len(goneKeys)+goneProposals+1)
	}
	for _, q := range queues {
		if rc.HExists(ctx, Own("acme", q).Restore(), "gone").Val() {
			t.Errorf("restore proposal of gone in queue %s not deleted", q)
		}
	}
	if !rc.HExists(ctx, Own("acme", queues[0]).Restore(), "live").Val() {
		t.Error("restore proposal of live deleted")
	}
	for _, k := range append(goneKeys, history) {
		if rc.Exists(ctx, k).Val() != 0 {
			t.Errorf("key %s not deleted", k)
		}
	}
	for _, q := range queues {
		for _, k := range []string{Own("acme", q).Watermark("live"), Own("other", q).Watermark("gone")} {
			if rc.Exists(ctx, k).Val() != 1 {
				t.Errorf("key %s deleted", k)
			}
		}
	}

	// changed is registered again after the scan: its first fire moves the
	// watermark in one slot and records history after the removal, and a
	// replica raises its restore proposal in another.
	moved := Own("acme", queues[0]).Watermark("changed")
	rc.Set(ctx, moved, "2 t", 0)
	propose(queues[1], "changed", removedAt.Add(5*time.Second))
	rc.ZAdd(ctx, SchedulerHistoryKey("changed"),
		redis.Z{Score: float64(removedAt.Unix() - 1), Member: "old"},
		redis.Z{Score: float64(removedAt.Unix() + 5), Member: "new"})
	n, err = s.DeleteRemovedEntryKeys(ctx, byEntry["changed"], removedAt)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(queues)-1 {
		t.Errorf("deleted %d keys of changed, want %d", n, len(queues)-1)
	}
	if rc.Get(ctx, moved).Val() != "2 t" {
		t.Error("a watermark written after the scan was deleted")
	}
	if !rc.HExists(ctx, Own("acme", queues[1]).Restore(), "changed").Val() {
		t.Error("a restore proposal raised after the scan was deleted")
	}
	if got := rc.ZRange(ctx, SchedulerHistoryKey("changed"), 0, -1).Val(); !slices.Equal(got, []string{"new"}) {
		t.Errorf("history of changed = %v, want only the event after the removal", got)
	}
}
