package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// slowRestores is a Redis that answers each restore proposal after per
// (on the manual clock) and holds it until RestoreSettle after it was
// first made; every watermark it holds is behind.
type slowRestores struct {
	Broker // the calls a load of held entries does not make
	clk    *clock.Manual
	per    time.Duration
	behind time.Time
	first  map[string]time.Time // entry -> when its proposal was made
	asked  map[string]int
}

func (b *slowRestores) Watermarks(_ context.Context, _, _ string, entries []string) ([]taskstate.WatermarkInfo, error) {
	out := make([]taskstate.WatermarkInfo, len(entries))
	for i := range out {
		out[i] = taskstate.WatermarkInfo{Tick: b.behind, OK: true}
	}
	return out, nil
}

func (b *slowRestores) ProposeRestore(_ context.Context, _, _, entry string, tick time.Time, taskID string, settle time.Duration) (taskstate.RestoreProposal, error) {
	b.clk.Advance(b.per)
	b.asked[entry]++
	if _, ok := b.first[entry]; !ok {
		b.first[entry] = b.clk.Now()
	}
	left := b.first[entry].Add(settle).Sub(b.clk.Now())
	return taskstate.RestoreProposal{Found: true, Tick: tick, TaskID: taskID, Settled: left <= 0, Left: left}, nil
}

// TestRestoreHoldsLeaveTheRestToLoad: a replica finds the watermarks of
// many entries behind (a lagging Redis promoted) and Redis answers slowly,
// so a load pass reaches only some of them before loadBudget. The entries
// it holds for their restore proposals must not hold back those it did
// not reach: every entry proposes its restore before the first proposal
// settles, so each records what Redis lost within one settle of finding
// it (docs/design.md, failure table: "every loss of a published fire is
// recorded at the entry's next tick after the failover plus the 3 s the
// restore settles"). A held entry is not proposed again meanwhile.
func TestRestoreHoldsLeaveTheRestToLoad(t *testing.T) {
	m := clock.NewManual(machineStart)
	clk := clock.New(nil, clock.Options{Manual: m})
	handled := machineStart.Truncate(time.Second)
	b := &slowRestores{clk: m, per: 100 * time.Millisecond, behind: handled.Add(-5 * time.Second),
		first: map[string]time.Time{}, asked: map[string]int{}}
	s := &Scheduler{
		cfg: Config{ReplicaID: "r1", Grace: DefaultGrace, MaxCatchup: DefaultMaxCatchup, RestoreSettle: DefaultRestoreSettle,
			Names: events.MustNames(events.DefaultPrefix)},
		broker: b, src: events.ReplicaSource("r1"), m: NewMetrics(nil), clock: clk, log: slog.New(slog.DiscardHandler),
		entries: map[string]*entryRun{}, loading: map[string]*entryRun{}, pos: positions{now: clk.Now},
	}
	const n = 20 // 2 s of proposals, five per pass
	for i := range n {
		id := fmt.Sprintf("e%02d", i)
		en := events.Entry{ID: id, Cron: "@every 1s", Task: events.Task{Type: "t"}}
		s.applyChange(projector.Change{ID: id, New: &projector.State{Entry: en.Normalize(), Revision: 1, Time: machineStart.Add(-time.Hour)}, Seq: 1})
		r := s.loading[id]
		if r == nil {
			t.Fatalf("%s is not loading", id)
		}
		// Reloaded after a fire found its watermark back before a tick
		// this replica handled.
		r.handled, r.hasHandled = handled, true
	}
	began := m.Now()
	for m.Now().Sub(began) < DefaultRestoreSettle && len(b.asked) < n {
		if wait := clk.Until(s.loadAfter); wait > 0 {
			m.Advance(wait)
			continue
		}
		s.loadWatermarks(context.Background())
	}
	if len(b.asked) < n {
		t.Fatalf("%d of %d entries proposed their restore within the settle (%s); the others waited for the entries held before them",
			len(b.asked), n, DefaultRestoreSettle)
	}
	for id, k := range b.asked {
		if k != 1 {
			t.Errorf("%s: restore proposed %d times before it could settle, want once", id, k)
		}
	}
	if got := s.restoringEntries(); got != n {
		t.Errorf("%d entries held for their restore, want %d", got, n)
	}
}
