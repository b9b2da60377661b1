package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// machineT drives the entry state machine (machine.go) of a scheduler that
// never runs: no loop, no Redis, no NATS, a manual clock. Each event is
// applied by the function the loop calls for it (applyChange,
// foundRemoved, loadRun, apply and passed, dropRun); a watermark read or a
// fire's result is given as Redis would answer, and with no History the
// load reads no stream.
type machineT struct {
	t   *testing.T
	s   *Scheduler
	clk *clock.Manual
	seq uint64 // the config stream's last sequence
	// overlap is the entry's overlap policy unless an edit changes it.
	overlap events.OverlapPolicy
}

// machineID is the one entry a machine test drives.
const machineID = "e1"

// machineStart is half a minute after a tick of @every 1m, whose ticks
// are the minutes.
var machineStart = time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)

func newMachineT(t *testing.T) *machineT {
	m := clock.NewManual(machineStart)
	clk := clock.New(nil, clock.Options{Manual: m})
	s := &Scheduler{
		cfg: Config{ReplicaID: "r1", Grace: DefaultGrace, MaxCatchup: DefaultMaxCatchup, Names: events.MustNames(events.DefaultPrefix)},
		src: events.ReplicaSource("r1"), m: NewMetrics(nil), clock: clk, log: slog.New(slog.DiscardHandler),
		entries: map[string]*entryRun{}, loading: map[string]*entryRun{}, pos: positions{now: clk.Now},
	}
	return &machineT{t: t, s: s, clk: m}
}

func (mt *machineT) now() time.Time { return mt.clk.Now() }

// state is the entry's state after a config event stored now: @every 1m
// into queue default, as edit changes it.
func (mt *machineT) state(edit func(*events.Entry)) *projector.State {
	mt.t.Helper()
	mt.seq++
	en := events.Entry{ID: machineID, Cron: "@every 1m", Task: events.Task{Type: "t"}, Overlap: mt.overlap}
	if edit != nil {
		edit(&en)
	}
	if err := en.Validate(); err != nil {
		mt.t.Fatal(err)
	}
	st := &projector.State{Entry: en.Normalize(), Revision: mt.seq, Time: mt.now()}
	if en.Limited() {
		st.MaxFiresSince = mt.seq
	}
	return st
}

func paused(e *events.Entry) { e.Paused = true }

// change applies the projection's change of the entry from old to new
// (nil: none), stored now.
func (mt *machineT) change(old, new *projector.State) {
	mt.s.applyChange(projector.Change{ID: machineID, Old: old, New: new, Seq: mt.seq, Time: mt.now()})
}

// edit applies a config event that changes the entry's current state r.st.
func (mt *machineT) edit(r *entryRun, edit func(*events.Entry)) {
	old := r.st
	mt.change(&old, mt.state(func(e *events.Entry) {
		*e = old.Entry
		edit(e)
	}))
}

// removed applies the entry's removal, stored now.
func (mt *machineT) removed(r *entryRun, quarantined bool) {
	mt.seq++
	old := r.st
	mt.s.applyChange(projector.Change{ID: machineID, Old: &old, Seq: mt.seq, Time: mt.now(), Quarantined: quarantined})
}

// read ends a load step as loadWatermarks does, the watermark read as
// tick (zero: none).
func (mt *machineT) read(r *entryRun, tick time.Time) {
	mt.t.Helper()
	if mt.s.loading[r.id] != r {
		mt.t.Fatalf("a watermark read for a run in state %s, not loading", stateName(r.state))
	}
	mt.s.loadRun(context.Background(), r, taskstate.WatermarkInfo{Tick: tick, OK: !tick.IsZero()}, mt.now(), &loadPass{})
}

// fire moves the clock to r's due instant and runs a fire pass of r as
// fireDue and finishPass do, Redis answering each fire with answer.
func (mt *machineT) fire(r *entryRun, answer func(taskstate.Fire) taskstate.FireResult) {
	mt.t.Helper()
	if r.index < 0 {
		mt.t.Fatalf("fire: the run (state %s) is not in the heap", stateName(r.state))
	}
	if r.due.After(mt.now()) {
		mt.clk.AdvanceTo(r.due)
	}
	now := mt.now()
	if due := mt.s.heap.popDue(now, nil); len(due) != 1 || due[0] != r {
		mt.t.Fatalf("due at %s: %d runs, want the entry's", now.Format(time.TimeOnly), len(due))
	}
	fires, more := mt.s.plan(r, now, nil)
	if len(fires) == 0 {
		mt.t.Fatalf("nothing to fire at %s", now.Format(time.TimeOnly))
	}
	for i := range fires {
		res := answer(fires[i])
		mt.s.apply(r, sentOf(&fires[i], &res), res, now)
	}
	mt.s.passed(r, more, now, now)
}

// Redis's answers to a fire.
func committed(f taskstate.Fire) taskstate.FireResult {
	if f.Kind == taskstate.FireSkip {
		return taskstate.FireResult{Status: taskstate.StatusSkippedMissed}
	}
	return taskstate.FiredPending("task-"+f.Tick.Format(time.TimeOnly), f.Tick)
}

func watermarkLost(taskstate.Fire) taskstate.FireResult {
	return taskstate.FireResult{Status: taskstate.StatusWatermarkMismatch}
}

// The entry states, from (none), built by the events that lead there.

func (mt *machineT) inKnown() *entryRun {
	mt.change(mt.state(nil), mt.state(paused))
	return mt.in(stateKnown)
}

func (mt *machineT) inLoading(edit func(*events.Entry)) *entryRun {
	mt.change(nil, mt.state(edit))
	return mt.in(stateLoading)
}

// inFoundPaused is an entry found paused at start: loading, its settle
// to be read from its watermark and history.
func (mt *machineT) inFoundPaused() *entryRun {
	mt.change(nil, mt.state(paused))
	r := mt.in(stateLoading)
	if mt.s.foundStopped(r.id) != r {
		mt.t.Fatal("an entry found paused is not waiting for its load")
	}
	return r
}

// inReady is an entry loaded with its watermark at the last tick before
// it registered, due at the next one.
func (mt *machineT) inReady(edit func(*events.Entry)) *entryRun {
	r := mt.inLoading(edit)
	mt.read(r, machineStart.Truncate(time.Minute))
	mt.in(stateReady)
	mt.inHeapAt(r, machineStart.Truncate(time.Minute).Add(time.Minute))
	return r
}

// inReadyPaused is a ready entry paused with nothing to settle: out of
// the heap.
func (mt *machineT) inReadyPaused() *entryRun {
	r := mt.inReady(nil)
	mt.edit(r, paused)
	mt.in(stateReady)
	mt.notInHeap(r)
	return r
}

func (mt *machineT) inIdle() *entryRun {
	r := mt.inFoundPaused()
	mt.read(r, time.Time{})
	return mt.in(stateIdle)
}

func (mt *machineT) inRemovedLoading() *entryRun {
	mt.s.foundRemoved(projector.Change{ID: machineID, Old: mt.state(nil), Seq: mt.seq + 1, Time: mt.now()})
	mt.seq++
	return mt.in(stateRemovedLoading)
}

// inRemoving is a ready entry removed three minutes after its last fire:
// three ticks to record as skipped.
func (mt *machineT) inRemoving() *entryRun {
	r := mt.inReady(nil)
	mt.clk.Advance(3 * time.Minute)
	mt.removed(r, false)
	mt.in(stateRemoving)
	mt.inHeapAt(r, mt.now())
	return r
}

// in returns the entry's run after checking it is in state want and that
// every index agrees with the runs' states.
func (mt *machineT) in(want entryState) *entryRun {
	mt.t.Helper()
	mt.consistent()
	r := mt.s.entries[machineID]
	got := stateNone
	if r != nil {
		got = r.state
	}
	if got != want {
		mt.t.Fatalf("entry in state %s, want %s", stateName(got), stateName(want))
	}
	return r
}

// consistent checks the indexes enter keeps against the runs' states:
// s.loading holds exactly the loading runs, the heap only runs that fire
// (each at its index, in heap order), removedRuns counts the removed runs.
func (mt *machineT) consistent() {
	mt.t.Helper()
	s := mt.s
	removed := 0
	for id, r := range s.entries {
		if r.id != id || r.state == stateNone {
			mt.t.Errorf("s.entries[%q] holds run %q in state %s", id, r.id, stateName(r.state))
		}
		if r.state.loads() != (s.loading[id] == r) {
			mt.t.Errorf("run %q in state %s: in s.loading %v", id, stateName(r.state), s.loading[id] == r)
		}
		if r.index >= 0 && !r.state.fires() {
			mt.t.Errorf("run %q in state %s is in the heap", id, stateName(r.state))
		}
		if r.state.removed() {
			removed++
		}
	}
	for id, r := range s.loading {
		if s.entries[id] != r {
			mt.t.Errorf("s.loading holds run %q, which s.entries does not", id)
		}
	}
	for i, r := range s.heap.h {
		if r.index != i || s.entries[r.id] != r {
			mt.t.Errorf("heap[%d] holds run %q (index %d), which s.entries does not", i, r.id, r.index)
		}
		if p := (i - 1) / 2; i > 0 && s.heap.h[p].due.After(r.due) {
			mt.t.Errorf("heap out of order at %d", i)
		}
	}
	if removed != s.removedRuns {
		mt.t.Errorf("removedRuns = %d, want %d", s.removedRuns, removed)
	}
	holding := map[string]int{}
	for _, r := range s.entries {
		if q := r.heldQueue(); q != "" {
			holding[q]++
		}
	}
	if !maps.Equal(holding, s.held.entries) {
		mt.t.Errorf("the held-tick check's queues %v, want %v", s.held.entries, holding)
	}
}

func (mt *machineT) inHeapAt(r *entryRun, due time.Time) {
	mt.t.Helper()
	if r.index < 0 || !r.due.Equal(due) {
		mt.t.Fatalf("run in heap %v, due %s; want due %s", r.index >= 0, r.due.Format(time.TimeOnly), due.Format(time.TimeOnly))
	}
}

func (mt *machineT) notInHeap(r *entryRun) {
	mt.t.Helper()
	if r.index >= 0 {
		mt.t.Fatalf("run due %s is in the heap, want out of it", r.due.Format(time.TimeOnly))
	}
}

// stateName is a state as the table in machine.go names it.
func stateName(st entryState) string {
	return map[entryState]string{
		stateNone: "(none)", stateKnown: "known", stateLoading: "loading", stateReady: "ready",
		stateIdle: "idle", stateRemovedLoading: "removedLoading", stateRemoving: "removing",
	}[st]
}

// machineCase is one way of taking one row of the table: put the entry in
// the row's state, apply the event, then check what the next state alone
// does not say.
type machineCase struct {
	name  string
	put   func(mt *machineT) *entryRun // nil: the entry has no run
	event func(mt *machineT, r *entryRun)
	check func(mt *machineT, r *entryRun) // the run in the next state; may be nil
}

// machineRow is one row of the table in machine.go's doc comment.
type machineRow struct {
	state, event, next string // as the table writes them
	cases              []machineCase
}

// machineRows takes every row of the table.
var machineRows = []machineRow{
	{"(none)", "registered", "loading", []machineCase{{
		event: func(mt *machineT, _ *entryRun) { mt.change(nil, mt.state(nil)) },
		check: func(mt *machineT, r *entryRun) {
			if !r.floor.Equal(machineStart) {
				mt.t.Errorf("floor %s, want the registration", r.floor)
			}
		},
	}}},
	{"(none)", "found paused (at start, in a shard taken)", "loading", []machineCase{{
		event: func(mt *machineT, _ *entryRun) { mt.change(nil, mt.state(paused)) },
		check: func(mt *machineT, r *entryRun) {
			if mt.s.foundStopped(r.id) != r {
				mt.t.Error("not waiting for its load to say what to settle")
			}
		},
	}}},
	{"(none)", "paused before this replica loaded it", "known", []machineCase{{
		event: func(mt *machineT, _ *entryRun) { mt.change(mt.state(nil), mt.state(paused)) },
	}}},
	{"(none)", "found removed (at start, in a shard taken)", "removedLoading", []machineCase{{
		event: func(mt *machineT, _ *entryRun) {
			mt.seq++
			mt.s.foundRemoved(projector.Change{ID: machineID, Old: mt.state(nil), Seq: mt.seq, Time: mt.now()})
		},
	}}},
	{"known", "changed, still paused", "known", []machineCase{{
		put:   (*machineT).inKnown,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Cron = "@every 2m" }) },
		check: func(mt *machineT, r *entryRun) {
			if r.st.Entry.Cron != "@every 2m" {
				mt.t.Errorf("known state not changed: %q", r.st.Entry.Cron)
			}
		},
	}}},
	{"known", "resumed", "loading", []machineCase{{
		put:   (*machineT).inKnown,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Paused = false }) },
	}}},
	{"loading", "changed; paused", "loading", []machineCase{{
		name:  "changed",
		put:   func(mt *machineT) *entryRun { return mt.inLoading(nil) },
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Cron = "@every 2m" }) },
	}, {
		name:  "paused",
		put:   func(mt *machineT) *entryRun { return mt.inLoading(nil) },
		event: func(mt *machineT, r *entryRun) { mt.edit(r, paused) },
		check: func(mt *machineT, r *entryRun) {
			if r.settle == nil || r.settle.until.IsZero() {
				mt.t.Error("the pause's settle is not kept for after the load")
			}
		},
	}}},
	{"loading", "any change, while found paused", "loading", []machineCase{{
		name:  "resumed",
		put:   (*machineT).inFoundPaused,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Paused = false }) },
		check: func(mt *machineT, r *entryRun) {
			mt.waits(r, 1)
			// The load rests the run (nothing to settle), then the resume
			// applies: loading again, as a run resumed from idle.
			mt.read(r, time.Time{})
			mt.in(stateLoading)
			mt.waits(r, 0)
		},
	}, {
		name:  "removed",
		put:   (*machineT).inFoundPaused,
		event: func(mt *machineT, r *entryRun) { mt.removed(r, false) },
		check: func(mt *machineT, r *entryRun) { mt.waits(r, 1) },
	}}},
	{"removedLoading", "any change, while found removed", "removedLoading", []machineCase{{
		name:  "registered again",
		put:   (*machineT).inRemovedLoading,
		event: func(mt *machineT, _ *entryRun) { mt.change(nil, mt.state(nil)) },
		check: func(mt *machineT, r *entryRun) {
			mt.waits(r, 1)
			// Nothing to settle: the removed run goes, and the
			// registration applies as a new run.
			mt.read(r, time.Time{})
			mt.in(stateLoading)
		},
	}}},
	{"loading", "watermark read", "ready", []machineCase{{
		put:   func(mt *machineT) *entryRun { return mt.inLoading(nil) },
		event: func(mt *machineT, r *entryRun) { mt.read(r, machineStart.Truncate(time.Minute)) },
		check: func(mt *machineT, r *entryRun) { mt.inHeapAt(r, machineStart.Truncate(time.Minute).Add(time.Minute)) },
	}}},
	{"loading", "watermark read, paused, ticks to settle", "ready", []machineCase{{
		// Loading again after its watermark was found lost at the 12:01
		// tick, paused at 12:02:30; another replica restored the
		// watermark at 12:00: the ticks of 12:01 and 12:02 are to settle.
		put: func(mt *machineT) *entryRun {
			r := mt.inReady(nil)
			mt.fire(r, watermarkLost)
			mt.in(stateLoading)
			mt.clk.Advance(90 * time.Second)
			mt.edit(r, paused)
			return mt.in(stateLoading)
		},
		event: func(mt *machineT, r *entryRun) { mt.read(r, machineStart.Truncate(time.Minute)) },
		check: func(mt *machineT, r *entryRun) {
			// Due at the pause, after the backoff of the refusal.
			mt.inHeapAt(r, mt.now().Add(200*time.Millisecond))
			if n := r.settleTicks().Count; n != 2 {
				mt.t.Errorf("%d ticks to settle, want 2", n)
			}
		},
	}}},
	{"loading", "watermark read, paused, nothing to settle", "idle", []machineCase{{
		name:  "found paused",
		put:   (*machineT).inFoundPaused,
		event: func(mt *machineT, r *entryRun) { mt.read(r, time.Time{}) },
	}, {
		name: "paused while loading",
		put: func(mt *machineT) *entryRun {
			r := mt.inLoading(nil)
			mt.edit(r, paused)
			return r
		},
		event: func(mt *machineT, r *entryRun) { mt.read(r, machineStart.Truncate(time.Minute)) },
	}}},
	{"ready", "due", "ready", []machineCase{{
		name:  "fired",
		put:   func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) { mt.fire(r, committed) },
		check: func(mt *machineT, r *entryRun) {
			tick := machineStart.Truncate(time.Minute).Add(time.Minute)
			if !r.cursor.Equal(tick) {
				mt.t.Errorf("cursor %s, want the fired tick %s", r.cursor, tick)
			}
			mt.inHeapAt(r, tick.Add(time.Minute))
		},
	}, {
		name: "failed",
		put:  func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) {
			mt.fire(r, func(taskstate.Fire) taskstate.FireResult {
				return taskstate.FireResult{Err: errors.New("redis unreachable")}
			})
		},
		check: func(mt *machineT, r *entryRun) {
			if r.tries != 1 {
				mt.t.Errorf("tries = %d, want 1", r.tries)
			}
			mt.inHeapAt(r, mt.now().Add(200*time.Millisecond))
		},
	}}},
	{"ready", "changed, same queue; resumed", "ready", []machineCase{{
		name:  "changed",
		put:   func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Cron = "@every 2m" }) },
		check: func(mt *machineT, r *entryRun) {
			// A new spec fires none of its ticks before the change.
			mt.inHeapAt(r, machineStart.Truncate(2*time.Minute).Add(2*time.Minute))
		},
	}, {
		name:  "resumed",
		put:   (*machineT).inReadyPaused,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Paused = false }) },
		check: func(mt *machineT, r *entryRun) { mt.inHeapAt(r, machineStart.Truncate(time.Minute).Add(time.Minute)) },
	}}},
	{"ready", "changed to another queue", "loading", []machineCase{{
		put:   func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Options.Queue = "critical" }) },
		check: func(mt *machineT, r *entryRun) {
			if r.loading.fromQueue != "default" || r.queue != "critical" {
				mt.t.Errorf("queue %q, closed first in %q; want critical after default", r.queue, r.loading.fromQueue)
			}
		},
	}}},
	{"ready", "paused", "ready", []machineCase{{
		name:  "nothing to settle",
		put:   func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) { mt.edit(r, paused) },
		check: func(mt *machineT, r *entryRun) { mt.notInHeap(r) },
	}, {
		name: "ticks to settle",
		put: func(mt *machineT) *entryRun {
			r := mt.inReady(nil)
			mt.clk.Advance(2 * time.Minute)
			return r
		},
		event: func(mt *machineT, r *entryRun) { mt.edit(r, paused) },
		check: func(mt *machineT, r *entryRun) {
			mt.inHeapAt(r, mt.now())
			// Once they are recorded, out of the heap.
			mt.fire(r, committed)
			mt.in(stateReady)
			mt.notInHeap(r)
		},
	}}},
	{"ready", "fire refused: max_fires reached", "ready", []machineCase{{
		put: func(mt *machineT) *entryRun { return mt.inReady(func(e *events.Entry) { e.MaxFires = 1 }) },
		event: func(mt *machineT, r *entryRun) {
			mt.fire(r, func(taskstate.Fire) taskstate.FireResult {
				return taskstate.FireResult{Status: taskstate.StatusCompleted, Fires: 1}
			})
		},
		check: func(mt *machineT, r *entryRun) {
			mt.notInHeap(r)
			// A new limit counts afresh: back in the heap.
			mt.edit(r, func(e *events.Entry) { e.MaxFires = 2 })
			mt.in(stateReady)
			if r.index < 0 {
				mt.t.Error("a new limit leaves the entry out of the heap")
			}
		},
	}}},
	{"ready", "fire: watermark lost, or moved back here", "loading", []machineCase{{
		name:  "watermark lost",
		put:   func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) { mt.fire(r, watermarkLost) },
	}, {
		name: "moved back here",
		put:  func(mt *machineT) *entryRun { return mt.inReady(nil) },
		event: func(mt *machineT, r *entryRun) {
			mt.fire(r, func(taskstate.Fire) taskstate.FireResult {
				return taskstate.FireResult{Status: taskstate.StatusMoved, MovedAt: r.st.Revision - 1}
			})
		},
		check: func(mt *machineT, r *entryRun) {
			if !r.loading.reopen {
				mt.t.Error("the load is not asked to reopen the queue")
			}
		},
	}}},
	{"ready", "removed, ticks to settle", "removing", []machineCase{{
		put: func(mt *machineT) *entryRun {
			r := mt.inReady(nil)
			mt.clk.Advance(3 * time.Minute)
			return r
		},
		event: func(mt *machineT, r *entryRun) { mt.removed(r, false) },
		check: func(mt *machineT, r *entryRun) {
			mt.inHeapAt(r, mt.now())
			if r.settle == nil || r.settle.reason != events.SkipRemoved {
				mt.t.Errorf("settle %+v, want reason removed", r.settle)
			}
		},
	}}},
	{"idle", "resumed", "loading", []machineCase{{
		put:   (*machineT).inIdle,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Paused = false }) },
		check: func(mt *machineT, r *entryRun) {
			if !r.floor.Equal(mt.now()) {
				mt.t.Errorf("floor %s, want the resume", r.floor)
			}
		},
	}}},
	{"idle", "changed, still paused", "idle", []machineCase{{
		put:   (*machineT).inIdle,
		event: func(mt *machineT, r *entryRun) { mt.edit(r, func(e *events.Entry) { e.Cron = "@every 2m" }) },
	}}},
	{"removedLoading", "watermark read, ticks to settle", "removing", []machineCase{{
		// The removal came three minutes after the watermark's tick. What
		// the config stream says of it (stopSince) is given as the load
		// would read it: this test has no stream.
		put: func(mt *machineT) *entryRun {
			r := mt.inRemovedLoading()
			mt.clk.Advance(3 * time.Minute)
			r.loading.floorAtLoad = false
			r.settle.until = mt.now()
			return r
		},
		event: func(mt *machineT, r *entryRun) { mt.read(r, machineStart.Truncate(time.Minute)) },
		check: func(mt *machineT, r *entryRun) { mt.inHeapAt(r, mt.now()) },
	}}},
	{"removedLoading", "watermark read, nothing to settle", "(none)", []machineCase{{
		put:   (*machineT).inRemovedLoading,
		event: func(mt *machineT, r *entryRun) { mt.read(r, time.Time{}) },
	}}},
	{"removing", "settle recorded", "(none)", []machineCase{{
		put:   (*machineT).inRemoving,
		event: func(mt *machineT, r *entryRun) { mt.fire(r, committed) },
	}}},
	{"removing", "registered again", "ready", []machineCase{{
		name:  "active",
		put:   (*machineT).inRemoving,
		event: func(mt *machineT, _ *entryRun) { mt.change(nil, mt.state(nil)) },
		check: func(mt *machineT, r *entryRun) {
			// The settle goes first, by the old schedule and floor.
			mt.inHeapAt(r, r.settle.until)
		},
	}, {
		name:  "paused",
		put:   (*machineT).inRemoving,
		event: func(mt *machineT, _ *entryRun) { mt.change(nil, mt.state(paused)) },
		check: func(mt *machineT, r *entryRun) { mt.inHeapAt(r, r.settle.until) },
	}}},
	{"removing", "fire: watermark lost", "(none)", []machineCase{{
		put:   (*machineT).inRemoving,
		event: func(mt *machineT, r *entryRun) { mt.fire(r, watermarkLost) },
	}}},
	{"known..idle", "removed, nothing to settle; quarantined", "(none)", []machineCase{
		{name: "known", put: (*machineT).inKnown, event: removeEvent(false)},
		{name: "loading", put: func(mt *machineT) *entryRun { return mt.inLoading(nil) }, event: removeEvent(false)},
		{name: "ready", put: func(mt *machineT) *entryRun { return mt.inReady(nil) }, event: removeEvent(false)},
		{name: "idle", put: (*machineT).inIdle, event: removeEvent(false)},
		{name: "ready quarantined with ticks due", put: func(mt *machineT) *entryRun {
			r := mt.inReady(nil)
			mt.clk.Advance(3 * time.Minute)
			return r
		}, event: removeEvent(true)},
	}},
	{"any", "shard dropped, moved to another's shard", "(none)", []machineCase{
		{name: "known", put: (*machineT).inKnown, event: dropEvent},
		{name: "loading", put: func(mt *machineT) *entryRun { return mt.inLoading(nil) }, event: dropEvent},
		{name: "ready", put: func(mt *machineT) *entryRun { return mt.inReady(nil) }, event: dropEvent},
		{name: "idle", put: (*machineT).inIdle, event: dropEvent},
		{name: "removedLoading", put: (*machineT).inRemovedLoading, event: dropEvent},
		{name: "removing", put: (*machineT).inRemoving, event: dropEvent},
	}},
}

func removeEvent(quarantined bool) func(*machineT, *entryRun) {
	return func(mt *machineT, r *entryRun) { mt.removed(r, quarantined) }
}

func dropEvent(mt *machineT, r *entryRun) { mt.s.dropRun(r) }

// waits checks that n changes wait for r's load.
func (mt *machineT) waits(r *entryRun, n int) {
	mt.t.Helper()
	if len(r.waiting) != n {
		mt.t.Errorf("%d changes wait for the load, want %d", len(r.waiting), n)
	}
}

// machineTable returns the rows of the table in machine.go's doc comment
// as "state | event" → next.
func machineTable(t *testing.T) map[string]string {
	t.Helper()
	src, err := os.ReadFile("machine.go")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for line := range strings.Lines(string(src)) {
		row, ok := strings.CutPrefix(line, "//\t")
		if !ok || !strings.Contains(row, "|") || strings.HasPrefix(row, "---") {
			continue
		}
		cols := strings.Split(row, "|")
		for i := range cols {
			cols[i] = strings.TrimSpace(cols[i])
		}
		if len(cols) != 4 {
			t.Fatalf("table row of %d columns: %q", len(cols), row)
		}
		if cols[0] == "state" {
			continue // the heading
		}
		rows[cols[0]+" | "+cols[1]] = cols[2]
	}
	if len(rows) < 20 {
		t.Fatalf("found %d rows in machine.go's table; it has more", len(rows))
	}
	return rows
}

// TestEntryStateMachine walks the table of states and events in
// machine.go's doc comment: for each row, the entry is put in the row's
// state by the events that lead there, the row's event is applied, and
// the entry must be in the row's next state, with s.loading, the heap and
// the count of removed runs agreeing with every run's state. Every row of
// the table has a case here and every case a row, so the table and the
// code cannot drift apart.
func TestEntryStateMachine(t *testing.T) {
	table := machineTable(t)
	taken := map[string]bool{}
	for _, row := range machineRows {
		key := row.state + " | " + row.event
		if next, ok := table[key]; !ok {
			t.Errorf("the test takes row %q, which machine.go's table does not hold", key)
			continue
		} else if next != row.next {
			t.Errorf("row %q: the table says next %q, the test %q", key, next, row.next)
		}
		taken[key] = true
		// Each case once with the default overlap policy and once with one
		// that holds ticks, which the held-tick check's index follows.
		for _, c := range row.cases {
			for _, overlap := range []events.OverlapPolicy{"", events.OverlapBufferOne} {
				t.Run(strings.TrimSpace(row.state+" "+row.event+" "+c.name+" "+string(overlap)), func(t *testing.T) {
					mt := newMachineT(t)
					mt.overlap = overlap
					var r *entryRun
					if c.put != nil {
						r = c.put(mt)
					}
					c.event(mt, r)
					var want entryState
					for st := stateNone; st <= stateRemoving; st++ {
						if stateName(st) == row.next {
							want = st
						}
					}
					next := mt.in(want)
					if r != nil && next != r && r.state != stateNone {
						t.Errorf("the run left behind is in state %s", stateName(r.state))
					}
					if r != nil && r.state == stateNone && (r.index >= 0 || mt.s.loading[r.id] == r) {
						t.Error("a run out of the machine is still indexed")
					}
					if c.check != nil && next != nil {
						c.check(mt, next)
					}
				})
			}
		}
	}
	for key := range table {
		if !taken[key] {
			t.Errorf("machine.go's table row %q has no case here", key)
		}
	}
}
