package scalesim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/schedule"
)

// fakeRedis is the Redis the simulated replicas share, in memory: each
// entry's watermark with the fire script's compare-and-set, the revision
// fences, the shard leases with the lease scripts' rules, and when each
// replica last heard NATS. Its TIME is the simulation's clock. It also
// keeps the ledger the checks read: what was fired and skipped, and who
// took which shard when.
type fakeRedis struct {
	now   func() time.Time
	names events.Names

	mu     sync.Mutex
	wm     map[slotEntry]time.Time // watermark (millisecond precision)
	fence  map[string]uint64       // revision fence per queue
	leases map[events.Shard]taskstate.ShardLease
	// last is the last holder of each shard's lease, kept after it lapsed
	// or was released.
	last  map[events.Shard]string
	heard map[string]time.Time
	// book is, per entry, what its fires did.
	book map[string]*entryBook
	// sched is each entry's schedule, to check that a fire is the tick
	// after its watermark.
	sched map[string]*schedule.Schedule
	// shardSize is the number of entries of each shard (acquisitions are
	// counted in entries).
	shardSize map[events.Shard]int
	// takes are the lease acquisitions, in order.
	takes []take
	// faults are calls or fires the simulation does not expect, with
	// examples.
	faults []string
	nfault int
}

// slotEntry is a watermark's key: the entry in its queue's slot.
type slotEntry struct{ queue, entry string }

// entryBook is one entry's ledger.
type entryBook struct {
	fired   int32 // tasks created
	dup     int32 // a task created for a tick at or before one created before
	gap     int32 // a task created for a tick that is not the one after the watermark
	skipped int32 // ticks recorded as skipped (missed), none expected
}

// take is one acquisition of a shard lease by a replica that did not
// hold it.
type take struct {
	shard  events.Shard
	holder string
	from   string // the previous holder, "" when the lease was free from the start
	at     time.Time
}

func newFakeRedis(names events.Names, now func() time.Time) *fakeRedis {
	return &fakeRedis{now: now, names: names,
		wm: map[slotEntry]time.Time{}, fence: map[string]uint64{}, leases: map[events.Shard]taskstate.ShardLease{},
		last: map[events.Shard]string{}, heard: map[string]time.Time{}, book: map[string]*entryBook{}, sched: map[string]*schedule.Schedule{},
		shardSize: map[events.Shard]int{}}
}

// seed sets entry's watermark (its last handled tick) before the run.
func (r *fakeRedis) seed(queue, entry string, wm time.Time, s *schedule.Schedule) {
	r.wm[slotEntry{queue, entry}] = wm.Truncate(time.Millisecond)
	r.book[entry] = &entryBook{}
	r.sched[entry] = s
	r.shardSize[events.ShardOfEntry(queue, entry)]++
}

// fault records something the simulation does not expect.
func (r *fakeRedis) faultLocked(format string, args ...any) {
	r.nfault++
	if len(r.faults) < 20 {
		r.faults = append(r.faults, fmt.Sprintf(format, args...))
	}
}

func (r *fakeRedis) fault(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faultLocked(format, args...)
}

// fire is one fire, as the fire script decides it (lua/fire.lua): the
// revision fence, then the watermark's compare-and-set, then the task.
// Only scheduled ticks and skips are modelled; the simulation's entries
// have no overlap policy, unique lock, limit or trigger.
func (r *fakeRedis) fireLocked(fences taskstate.Fences, f *taskstate.Fire) taskstate.FireResult {
	if f.Kind != taskstate.FireTick && f.Kind != taskstate.FireSkip {
		r.faultLocked("fire of kind %s (entry %s) is not modelled", f.Kind, f.Entry)
		return taskstate.FireResult{Err: errors.New("not modelled")}
	}
	if fence, ok := r.fence[f.Queue]; ok && fences.ConfigSeq < fence {
		return taskstate.FireResult{Status: taskstate.StatusRevisionFenced, Fence: fence}
	} else if !ok || fences.ConfigSeq > fence {
		r.fence[f.Queue] = fences.ConfigSeq
	}
	key := slotEntry{f.Queue, f.Entry}
	wm, has := r.wm[key]
	expected := f.Expected.Truncate(time.Millisecond)
	if (f.ExpectNone && has) || (!f.ExpectNone && (!has || !wm.Equal(expected))) {
		res := taskstate.FireResult{Status: taskstate.StatusWatermarkMismatch, Watermark: wm, HasWatermark: has}
		if has {
			res.WatermarkTaskID = events.TaskID(r.names.Prefix(), f.Entry, wm)
		}
		return res
	}
	tick := f.Tick.Truncate(time.Millisecond)
	b := r.book[f.Entry]
	if b == nil {
		r.faultLocked("fire of unknown entry %s", f.Entry)
		return taskstate.FireResult{Err: errors.New("unknown entry")}
	}
	b.skipped += int32(len(f.SkippedRecords))
	r.wm[key] = tick
	if f.Kind == taskstate.FireSkip {
		return taskstate.FireResult{Status: taskstate.StatusSkippedMissed, Watermark: tick, HasWatermark: true,
			WatermarkTaskID: events.TaskID(r.names.Prefix(), f.Entry, wm)}
	}
	switch {
	case has && !tick.After(wm):
		b.dup++
	case has && len(f.SkippedRecords) == 0 && !r.sched[f.Entry].Next(wm).Equal(tick):
		b.gap++
	}
	b.fired++
	return taskstate.FiredPending(events.TaskID(r.names.Prefix(), f.Entry, tick), tick)
}

// lease reads shard's lease as Redis would: gone once its term passed.
func (r *fakeRedis) leaseLocked(s events.Shard, now time.Time) (taskstate.ShardLease, bool) {
	l, ok := r.leases[s]
	if ok && !now.Before(l.Expires()) {
		delete(r.leases, s)
		return taskstate.ShardLease{}, false
	}
	return l, ok
}

// takeLocked is the acquire and renew scripts' step for one shard.
func (r *fakeRedis) takeLocked(s events.Shard, owner string, ttl time.Duration, now time.Time) bool {
	now = now.Truncate(time.Millisecond)
	l, ok := r.leaseLocked(s, now)
	switch {
	case !ok:
		r.leases[s] = taskstate.ShardLease{Shard: s, Holder: owner, Acquired: now, Renewed: now, TTL: ttl}
		if r.last[s] != owner {
			r.takes = append(r.takes, take{shard: s, holder: owner, from: r.last[s], at: now})
			r.last[s] = owner
		}
		return true
	case l.Holder == owner:
		l.Renewed, l.TTL = now, ttl
		r.leases[s] = l
		return true
	}
	return false
}

// holder returns who holds shard's lease now ("" when nobody).
func (r *fakeRedis) holder(s events.Shard) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, _ := r.leaseLocked(s, r.now())
	return l.Holder
}

// errDead is every call's error once a replica was killed.
var errDead = errors.New("connection closed: replica killed")

// broker is one replica's connection to the fake Redis: it implements
// scheduler.Broker and ownership.Store, and counts that replica's work.
type broker struct {
	r  *fakeRedis
	id string

	dead atomic.Bool
	// attempts counts the fires sent; reads the watermarks read;
	// unleased the fires sent for a shard whose lease this replica did
	// not hold at that moment.
	attempts, reads, unleased atomic.Uint64
	leaseReads                atomic.Uint64
}

func (b *broker) FireBatchInto(_ context.Context, fences taskstate.Fences, fires []taskstate.Fire, results []taskstate.FireResult) ([]taskstate.FireResult, error) {
	if b.dead.Load() {
		return nil, errDead
	}
	b.attempts.Add(uint64(len(fires)))
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	results = results[:0]
	for i := range fires {
		f := &fires[i]
		if l, ok := r.leaseLocked(events.ShardOfEntry(f.Queue, f.Entry), now); !ok || l.Holder != b.id {
			b.unleased.Add(1)
		}
		results = append(results, r.fireLocked(fences, f))
	}
	return results, nil
}

func (b *broker) Watermarks(_ context.Context, _, queue string, entries []string) ([]taskstate.WatermarkInfo, error) {
	if b.dead.Load() {
		return nil, errDead
	}
	b.reads.Add(uint64(len(entries)))
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]taskstate.WatermarkInfo, len(entries))
	for i, id := range entries {
		if wm, ok := r.wm[slotEntry{queue, id}]; ok {
			out[i] = taskstate.WatermarkInfo{Tick: wm, TaskID: events.TaskID(r.names.Prefix(), id, wm), OK: true}
		}
	}
	return out, nil
}

// unexpected is a call the simulation's entries never make.
func (b *broker) unexpected(what string) error {
	if b.dead.Load() {
		return errDead
	}
	b.r.fault("%s: unexpected call %s", b.id, what)
	return fmt.Errorf("simulation: %s is not modelled", what)
}

func (b *broker) CloseForHandover(context.Context, string, string, string, uint64, string) (time.Time, string, bool, error) {
	return time.Time{}, "", false, b.unexpected("CloseForHandover")
}

func (b *broker) SeedWatermark(context.Context, string, string, string, time.Time, string, uint64, string) error {
	return b.unexpected("SeedWatermark")
}

func (b *broker) RestoreWatermark(context.Context, string, string, string, time.Time, string, uint64, string, *taskstate.LostRecord) (bool, error) {
	return false, b.unexpected("RestoreWatermark")
}

func (b *broker) FireCount(context.Context, string, string, string) (taskstate.FireCount, bool, error) {
	return taskstate.FireCount{}, false, b.unexpected("FireCount")
}

func (b *broker) SeedFireCount(context.Context, string, string, string, taskstate.FireCount) (taskstate.FireCount, error) {
	return taskstate.FireCount{}, b.unexpected("SeedFireCount")
}

func (b *broker) ClearFence(context.Context, string, string, uint64) (bool, error) {
	return false, b.unexpected("ClearFence")
}

func (b *broker) ClearHandover(context.Context, string, string, string, uint64) (bool, error) {
	return false, b.unexpected("ClearHandover")
}

func (b *broker) HandoverID(context.Context, string, string, string, uint64) (string, error) {
	return "", b.unexpected("HandoverID")
}

// asynq's scheduler entries and enqueue history: written, not kept.
func (b *broker) WriteSchedulerEntries(context.Context, string, []taskstate.SchedulerEntry, time.Duration) error {
	return b.alive()
}

func (b *broker) ClearSchedulerEntries(context.Context, string) error { return b.alive() }

func (b *broker) RecordSchedulerEnqueueEvents(context.Context, []taskstate.EnqueueEventRecord) error {
	return b.alive()
}

// No entry holds ticks (overlap buffer-one): there are none to release.
func (b *broker) HeldTicks(context.Context, string, []string) ([]taskstate.HeldTick, error) {
	return nil, b.alive()
}

func (b *broker) Queues(context.Context) ([]string, error) { return nil, b.alive() }

func (b *broker) ReleaseHeld(context.Context, taskstate.Fences, taskstate.HeldTick, taskstate.HeldRelease) (taskstate.HeldOutcome, error) {
	return 0, b.unexpected("ReleaseHeld")
}

func (b *broker) ReleaseCancel(context.Context, taskstate.Fences, taskstate.HeldTick, taskstate.HeldRelease) (taskstate.CancelRelease, error) {
	return taskstate.CancelRelease{}, b.unexpected("ReleaseCancel")
}

func (b *broker) PublishCancel(context.Context, string) error { return b.unexpected("PublishCancel") }

// ProposeRestore with no position only reads: no watermark is lost in the
// simulation, so there is never a proposal.
func (b *broker) ProposeRestore(_ context.Context, _, _, entry string, tick time.Time, _ string, _ time.Duration) (taskstate.RestoreProposal, error) {
	if !tick.IsZero() {
		return taskstate.RestoreProposal{}, b.unexpected("ProposeRestore of " + entry)
	}
	return taskstate.RestoreProposal{}, b.alive()
}

func (b *broker) OpenRestore(_ context.Context, _, _, entry string, _ time.Duration) (taskstate.RestoreProposal, error) {
	return taskstate.RestoreProposal{}, b.unexpected("OpenRestore of " + entry)
}

func (b *broker) ClearRestore(context.Context, string, string, string, time.Time) error {
	return b.unexpected("ClearRestore")
}

func (b *broker) RestoreProposals(context.Context, string, []string) (map[string]map[string]time.Time, error) {
	return nil, b.alive()
}

func (b *broker) alive() error {
	if b.dead.Load() {
		return errDead
	}
	return nil
}

// ownership.Store.

func (b *broker) ShardLeases(_ context.Context, _ string, queues []string, heard bool) (taskstate.ShardLeaseView, error) {
	if b.dead.Load() {
		return taskstate.ShardLeaseView{}, errDead
	}
	b.leaseReads.Add(uint64(len(queues) * events.ShardsPerQueue))
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Truncate(time.Millisecond)
	v := taskstate.ShardLeaseView{Now: now}
	for _, q := range queues {
		for i := range events.ShardsPerQueue {
			if l, ok := r.leaseLocked(events.Shard{Queue: q, Index: i}, now); ok {
				v.Leases = append(v.Leases, l)
			}
		}
	}
	if heard {
		v.Heard = make(map[string]time.Time, len(r.heard))
		for id, at := range r.heard {
			v.Heard[id] = at
		}
	}
	return v, nil
}

func (b *broker) leaseCall(shards []events.Shard, f func(events.Shard, time.Time) bool) ([]taskstate.LeaseResult, error) {
	if b.dead.Load() {
		return nil, errDead
	}
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Truncate(time.Millisecond)
	out := make([]taskstate.LeaseResult, len(shards))
	for i, s := range shards {
		out[i] = taskstate.LeaseResult{Held: f(s, now), Now: now}
	}
	return out, nil
}

func (b *broker) AcquireShardLeases(_ context.Context, _, owner string, ttl time.Duration, shards []events.Shard) ([]taskstate.LeaseResult, error) {
	return b.leaseCall(shards, func(s events.Shard, now time.Time) bool { return b.r.takeLocked(s, owner, ttl, now) })
}

// RenewShardLeases is the acquire script's step too: the renew script
// takes a free lease again.
func (b *broker) RenewShardLeases(_ context.Context, _, owner string, ttl time.Duration, shards []events.Shard) ([]taskstate.LeaseResult, error) {
	return b.leaseCall(shards, func(s events.Shard, now time.Time) bool { return b.r.takeLocked(s, owner, ttl, now) })
}

func (b *broker) ReleaseShardLeases(_ context.Context, _, owner string, shards []events.Shard) ([]taskstate.LeaseResult, error) {
	return b.leaseCall(shards, func(s events.Shard, now time.Time) bool {
		if l, ok := b.r.leaseLocked(s, now); ok && l.Holder == owner {
			delete(b.r.leases, s)
			return true
		}
		return false
	})
}

func (b *broker) NoteNATSHeard(_ context.Context, _, replica string, at time.Time) error {
	if b.dead.Load() {
		return errDead
	}
	b.r.mu.Lock()
	b.r.heard[replica] = at
	b.r.mu.Unlock()
	return nil
}
