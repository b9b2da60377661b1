package taskstate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
)

// Overlap cancel-previous (Fire.OverlapCancel): the fire script deletes an
// entry's waiting previous task and fires the tick in one step, or holds
// the tick while the caller cancels the running one (PublishCancel);
// ReleaseCancel fires the held tick once that task has stopped.

// CancelChannel is asynq's pub/sub channel of cancellations: each worker
// subscribes to it and cancels the context of the handler running the task
// whose id is published.
const CancelChannel = "asynq:cancel"

// The placeholders a cancelled event's data carries where the script
// writes the replaced task's id, state and action (NewCancelRecord), each
// as a JSON string, in this order.
const (
	CancelPlaceholderTask   = "\x00task\x00"
	CancelPlaceholderState  = "\x00state\x00"
	CancelPlaceholderAction = "\x00action\x00"
)

// CancelRecord is the outbox record of a cancelled event
// (events.TypeTaskCancelled) whose replaced task only the fire script
// knows: its data cut into the four parts around the task id, state and
// action, which the script writes between them.
type CancelRecord struct {
	ID    string
	parts [4]string
}

// NewCancelRecord cuts data, an encoded event whose data has the
// placeholders (CancelPlaceholderTask, CancelPlaceholderState,
// CancelPlaceholderAction, as JSON strings, once each and in that order),
// into a CancelRecord with event id id.
func NewCancelRecord(id string, data []byte) (CancelRecord, error) {
	r := CancelRecord{ID: id}
	rest := data
	for i, ph := range []string{CancelPlaceholderTask, CancelPlaceholderState, CancelPlaceholderAction} {
		quoted := []byte(strconv.Quote(ph))
		// encoding/json writes control characters as \u00XX.
		quoted = bytes.ReplaceAll(quoted, []byte(`\x00`), []byte(`\u0000`))
		before, after, found := bytes.Cut(rest, quoted)
		if !found || bytes.Contains(after, quoted) {
			return CancelRecord{}, fmt.Errorf("cancelled record %s: placeholder %d not found once in order", id, i+1)
		}
		r.parts[i], rest = string(before), after
	}
	r.parts[3] = string(rest)
	return r, nil
}

func (r CancelRecord) check(required bool) error {
	switch {
	case r.ID == "" && r.parts == [4]string{}:
		if required {
			return errors.New("missing cancelled record")
		}
	case r.ID == "" || r.parts[0] == "":
		return errors.New("cancelled record needs both an event id and data")
	}
	return nil
}

// PublishCancel asks asynq's workers to cancel the running task id (asynq's
// Inspector.CancelProcessing): the handler's context is cancelled, and
// asynq then moves the task to retry (or archive). Publishing it more than
// once, or for a task no longer running, is harmless.
func (s *Store) PublishCancel(ctx context.Context, id string) error {
	if err := s.client.Publish(ctx, CancelChannel, id).Err(); err != nil {
		return fmt.Errorf("publish cancellation of task %s: %w", id, err)
	}
	return nil
}

// cancelGrace lets a live worker move a task whose deadline passed to
// retry (where ReleaseCancel deletes it) before the held tick stops
// waiting for it.
const cancelGrace = 5 * time.Second

// defaultTaskTimeout is asynq's timeout of a task that sets neither timeout
// nor deadline.
const defaultTaskTimeout = 30 * time.Minute

// giveUpAt is when a task that was active at heldAt has certainly passed
// the context deadline asynq gave its handler (it started before heldAt),
// plus cancelGrace; zero when msg does not decode.
func giveUpAt(msg []byte, heldAt time.Time) time.Time {
	m, err := DecodeTaskMessage(msg)
	if err != nil {
		return time.Time{}
	}
	var at time.Time
	switch {
	case m.Timeout == 0 && m.Deadline == 0:
		at = heldAt.Add(defaultTaskTimeout)
	case m.Timeout == 0:
		at = time.Unix(m.Deadline, 0)
	default:
		at = heldAt.Add(time.Duration(m.Timeout) * time.Second)
		if m.Deadline != 0 && time.Unix(m.Deadline, 0).Before(at) {
			at = time.Unix(m.Deadline, 0)
		}
	}
	return at.Add(cancelGrace)
}

// CancelRelease is what ReleaseCancel did.
type CancelRelease struct {
	Outcome HeldOutcome
	// Deleted is the state the previous task was deleted from (retry,
	// where asynq puts a cancelled task; "" = not deleted).
	Deleted string
	// GaveUp: the tick fired while the previous task was still active, its
	// timeout (or deadline) having passed.
	GaveUp bool
}

// cancelLayoutLua is the prelude of the release script (cancel_lib.lua's
// names).
var cancelLayoutLua = luaConstants([]luaConstant{
	{"CANCEL_DELETED", contract.CancelDeleted}, {"CANCEL_REQUESTED", contract.CancelRequested},
})

// ReleaseCancel fires h, a tick held by overlap cancel-previous
// (HeldTick.Cancel), once its previous task has left active, deleting that
// task when it went back to a waiting state (retry), or drops it when
// how.Drop is set: a compare-and-set on the held task id in one script
// call, so replicas checking at once fire it exactly once. As ReleaseHeld,
// the call presents fences and is refused by the slot's revision and
// staleness fences (HeldFenced, HeldStale, nothing written), and a dropped
// tick is counted in the slot's dropped counter with how.DroppedRecord
// appended. A previous task still active past its timeout or deadline
// (counted from h.HeldAt) holds the tick no longer. Cancel-previous has no
// fire limit (events refuses max_fires with it): how.MaxFires must be 0.
func (s *Store) ReleaseCancel(ctx context.Context, fences Fences, h HeldTick, how HeldRelease) (CancelRelease, error) {
	own, keys := Own(h.Prefix, h.Queue), Keys(h.Queue)
	fail := func(err error) (CancelRelease, error) {
		return CancelRelease{}, fmt.Errorf("release held tick %s of entry %q in queue %q: %w", h.Tick.Format(time.RFC3339Nano), h.Entry, h.Queue, err)
	}
	if err := fences.check(); err != nil {
		return fail(err)
	}
	if how.MaxFires != 0 {
		return fail(fmt.Errorf("%w: overlap cancel-previous with max fires %d", ErrInvalidFire, how.MaxFires))
	}
	mode, giveUp := "", int64(0)
	if how.Drop {
		mode = "drop"
	} else {
		msg, err := s.client.HGet(ctx, keys.Task(h.PrevTaskID), "msg").Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fail(err)
		}
		if at := giveUpAt(msg, h.HeldAt); len(msg) > 0 && !at.IsZero() && !h.HeldAt.IsZero() {
			giveUp = at.UnixMilli()
		}
	}
	fa := fences.args()
	reply, err := runScript(ctx, s.client, releaseCancelScript, []string{
		own.Held(h.Entry), own.HeldIndex(), own.Watermark(h.Entry), own.Handover(h.Entry),
		keys.Task(h.TaskID), keys.Task(h.PrevTaskID), keys.Pending(), own.Outbox(),
		own.Fence(), own.Freshness(), own.FenceID(), own.HeldDrops(),
	}, h.TaskID, mode, strconv.FormatInt(giveUp, 10), keys.Prefix(),
		fa.config, fa.fresh, fa.maxStale, how.DroppedRecord.ID, how.DroppedRecord.Data)
	if err != nil {
		return fail(err)
	}
	if len(reply) != 3 {
		return fail(fmt.Errorf("unexpected reply %v", reply))
	}
	code, _ := reply[0].(int64)
	deleted, _ := reply[2].(string)
	r := CancelRelease{Deleted: deleted}
	switch code {
	case 0:
		r.Outcome = HeldGone
	case 1:
		r.Outcome = HeldReleased
	case 2:
		r.Outcome = HeldWaiting
	case 3:
		r.Outcome = HeldDropped
	case 4:
		r.Outcome = HeldExisted
	case 5:
		r.Outcome, r.GaveUp = HeldReleased, true
	case 6:
		r.Outcome = HeldFenced
	case 7:
		r.Outcome = HeldStale
	default:
		return fail(fmt.Errorf("unexpected reply %v", reply))
	}
	return r, nil
}
