package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeldTick is a tick the fire script held for an entry with overlap
// buffer-one (StatusHeld): it fires as TaskID once PrevTaskID has left the
// busy states (ReleaseHeld).
type HeldTick struct {
	Prefix     string // tenant prefix ("" = DefaultPrefix)
	Queue      string
	Entry      string
	Tick       time.Time
	TaskID     string
	PrevTaskID string
	// Cancel: the tick is held by overlap cancel-previous while PrevTaskID,
	// whose cancellation was published at HeldAt, stops (ReleaseCancel).
	Cancel bool
	HeldAt time.Time
}

// HeldTicks returns the ticks held in each of queues, reading each queue's
// held index (one key; empty for a queue that holds none) and then the held
// ticks it lists, in two pipelined round trips.
func (s *Store) HeldTicks(ctx context.Context, prefix string, queues []string) ([]HeldTick, error) {
	if len(queues) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	index := make([]*redis.StringSliceCmd, len(queues))
	for i, q := range queues {
		index[i] = pipe.SMembers(ctx, Own(prefix, q).HeldIndex())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read held-tick indexes: %w", err)
	}
	var out []HeldTick
	var reads []*redis.SliceCmd
	for i, q := range queues {
		own := Own(prefix, q)
		for _, k := range index[i].Val() {
			entry, ok := own.heldEntry(k)
			if !ok {
				continue
			}
			out = append(out, HeldTick{Prefix: prefix, Queue: q, Entry: entry})
			reads = append(reads, pipe.HMGet(ctx, k, "tick", "task", "prev", "cancel", "held_at"))
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read held ticks: %w", err)
	}
	kept := out[:0]
	for i, h := range out {
		v := reads[i].Val()
		tick, _ := v[0].(string)
		h.TaskID, _ = v[1].(string)
		h.PrevTaskID, _ = v[2].(string)
		ms, err := strconv.ParseInt(tick, 10, 64)
		if err != nil || h.TaskID == "" {
			continue // released between the two reads
		}
		h.Tick = time.UnixMilli(ms).UTC()
		h.Cancel = v[3] == "1"
		if at, ok := v[4].(string); ok {
			if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
				h.HeldAt = time.UnixMilli(ms).UTC()
			}
		}
		kept = append(kept, h)
	}
	return kept, nil
}

// HeldOutcome is what ReleaseHeld did.
type HeldOutcome int

// Outcomes of ReleaseHeld.
const (
	// HeldGone: no such held tick any more (another replica released or
	// dropped it); nothing was written.
	HeldGone HeldOutcome = iota
	// HeldReleased: the task was created pending and the tick's fired
	// record appended.
	HeldReleased
	// HeldWaiting: the previous task is still busy; nothing was written.
	HeldWaiting
	// HeldDropped: the tick was dropped (asked to, or the entry moved out
	// of the queue) and the release's DroppedRecord appended.
	HeldDropped
	// HeldExisted: the task existed already; the tick was dropped.
	HeldExisted
	// HeldFenced: another replica already fired or released into this
	// slot from a newer configuration (the revision fence); nothing was
	// written.
	HeldFenced
	// HeldStale: the releasing replica's projection lags the freshest one
	// seen in this slot by more than its MaxStaleness (the staleness
	// fence); nothing was written.
	HeldStale
	// HeldCompleted: the entry's fire limit is reached (HeldRelease.MaxFires);
	// the tick was dropped and the release's DroppedRecord appended.
	HeldCompleted
)

// HeldRelease says how ReleaseHeld (and ReleaseCancel) treats a held tick.
type HeldRelease struct {
	// Drop discards the tick instead of firing it.
	Drop bool
	// DroppedRecord, when set, is appended to the outbox in the same step
	// whenever the tick is dropped rather than fired (asked to, or the
	// entry moved out of the queue): the skipped event of the tick.
	DroppedRecord Record
	// MaxFires and MaxFiresSince are the entry's fire limit as a fire
	// presents it (Fire.MaxFires): a release counts against it, checked and
	// moved in the same step, and a tick beyond it is dropped.
	MaxFires      int
	MaxFiresSince uint64
}

// ReleaseHeld fires h if it is still held and its previous task has left
// the busy states, or drops it when how.Drop is set: a compare-and-set on
// the held task id in one script call, so that replicas checking at once
// fire it exactly once. The call presents fences and is refused by the
// slot's revision and staleness fences as a fire would be (HeldFenced,
// HeldStale), so a replica whose projection lags neither fires nor drops a
// tick a newer configuration decided about. The task is enqueued pending
// with the message and the fired record kept when the tick was held (its
// scheduled time is the tick's); the watermark's task becomes h.TaskID.
func (s *Store) ReleaseHeld(ctx context.Context, fences Fences, h HeldTick, how HeldRelease) (HeldOutcome, error) {
	if err := fences.check(); err != nil {
		return HeldGone, err
	}
	own, keys := Own(h.Prefix, h.Queue), Keys(h.Queue)
	mode := ""
	if how.Drop {
		mode = "drop"
	}
	fa := fences.args()
	reply, err := runScript(ctx, s.client, releaseHeldScript, []string{
		own.Held(h.Entry), own.HeldIndex(), own.Watermark(h.Entry), own.Handover(h.Entry),
		keys.Task(h.TaskID), keys.Task(h.PrevTaskID), keys.Pending(), own.Outbox(),
		own.Fence(), own.Freshness(), own.FenceID(), own.HeldDrops(), own.Fires(h.Entry),
	}, h.TaskID, mode, fa.config, fa.fresh, fa.maxStale, how.DroppedRecord.ID, how.DroppedRecord.Data,
		strconv.Itoa(max(how.MaxFires, 0)), strconv.FormatUint(how.MaxFiresSince, 10))
	if err != nil {
		return HeldGone, fmt.Errorf("release held tick %s of entry %q in queue %q: %w", h.Tick.Format(time.RFC3339Nano), h.Entry, h.Queue, err)
	}
	code, _ := reply[0].(int64)
	switch code {
	case 0:
		return HeldGone, nil
	case 1:
		return HeldReleased, nil
	case 2:
		return HeldWaiting, nil
	case 3:
		return HeldDropped, nil
	case 4:
		return HeldExisted, nil
	case 5:
		return HeldFenced, nil
	case 6:
		return HeldStale, nil
	case 7:
		return HeldCompleted, nil
	}
	return HeldGone, fmt.Errorf("release held tick of entry %q: unexpected reply %v", h.Entry, reply)
}

// HeldCounts returns how many ticks queue holds now (overlap buffer-one)
// and how many held ticks were dropped there rather than fired, ever (for
// status).
func (s *Store) HeldCounts(ctx context.Context, prefix, queue string) (held, dropped int64, err error) {
	own := Own(prefix, queue)
	pipe := s.client.Pipeline()
	n := pipe.SCard(ctx, own.HeldIndex())
	d := pipe.Get(ctx, own.HeldDrops())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("held ticks of queue %q: %w", queue, err)
	}
	dropped, _ = d.Int64()
	return n.Val(), dropped, nil
}
