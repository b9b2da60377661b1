package taskstate

// Preparing a fire: checking a Fire and encoding its task message as
// asynq's client would, before it is laid out in a script call.

import (
	"fmt"
	"strings"
	"time"
)

// preparedFire is a validated fire with its encoded message.
type preparedFire struct {
	f     *Fire
	msg   []byte
	id    string
	group string
	own   OwnKeys
	keys  QueueKeys
}

// prepareSkip validates a FireSkip, which carries no task.
func prepareSkip(f *Fire, bad func(string, ...any) (preparedFire, error)) (preparedFire, error) {
	switch {
	case f.Tick.IsZero():
		return bad("zero tick")
	case !f.ExpectNone && f.Expected.IsZero():
		return bad("no expected watermark (set ExpectNone for an entry that never fired)")
	case !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli():
		return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
	case len(f.SkippedRecords) == 0:
		return bad("a skip without skipped records")
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	// The per-fire task keys are never touched by a skip; the queue's task
	// key prefix stands in for them (a real key name of the same slot).
	return preparedFire{f: f, keys: Keys(f.Queue)}, nil
}

// prepare validates f and encodes its message at the end of msgs; keys
// are those of f's queue.
func prepare(f *Fire, keys QueueKeys, msgs *[]byte) (preparedFire, error) {
	bad := func(format string, args ...any) (preparedFire, error) {
		return preparedFire{}, fmt.Errorf("%w: entry %q tick %s: %s", ErrInvalidFire, f.Entry, f.Tick.UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
	}
	if f.Entry == "" {
		return bad("empty entry id")
	}
	if f.Queue == "" {
		return bad("empty queue")
	}
	if f.Kind == FireSkip {
		return prepareSkip(f, bad)
	}
	if f.Msg == nil {
		return bad("no task message")
	}
	if strings.TrimSpace(f.Msg.Type) == "" {
		return bad("blank task type")
	}
	if f.Msg.ID == "" {
		return bad("empty task id")
	}
	if f.Msg.Queue != "" && f.Msg.Queue != f.Queue {
		return bad("message queue %q differs from fire queue %q", f.Msg.Queue, f.Queue)
	}
	if f.Tick.IsZero() {
		return bad("zero tick")
	}
	switch f.Kind {
	case FireTick:
		if !f.ExpectNone && f.Expected.IsZero() {
			return bad("no expected watermark (set ExpectNone for an entry that never fired)")
		}
		if !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli() {
			return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
		}
		if f.MaxFires < 0 {
			return bad("negative max fires %d", f.MaxFires)
		}
		if f.MaxFires > 0 && (f.MaxFiresSince == 0 || f.MaxFiresSince > 1<<53) {
			return bad("max fires without the revision it counts from (1 to 2^53)")
		}
	case FireTrigger:
		if f.RequestID == "" {
			return bad("trigger without request id")
		}
	case FireBackfill:
	default:
		return bad("unknown kind %d", f.Kind)
	}
	if f.UniqueTTL != 0 && f.UniqueTTL < time.Second {
		return bad("unique TTL %s is below asynq's minimum of 1s", f.UniqueTTL)
	}
	if f.TriggerTTL < 0 {
		return bad("negative trigger TTL")
	}
	if err := checkRecord("fired", f.FiredRecord, true); err != nil {
		return bad("%v", err)
	}
	if f.OverlapBuffer && (f.OverlapSkip || f.Kind != FireTick) {
		return bad("OverlapBuffer is for a FireTick without OverlapSkip")
	}
	if f.OverlapCancel && (f.OverlapSkip || f.OverlapBuffer || f.Kind != FireTick) {
		return bad("OverlapCancel is for a FireTick without OverlapSkip or OverlapBuffer")
	}
	if err := f.CancelRecord.check(f.OverlapCancel); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("overlap", f.OverlapRecord, f.OverlapSkip || f.OverlapBuffer || f.OverlapCancel); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("duplicate", f.DuplicateRecord, f.UniqueTTL > 0); err != nil {
		return bad("%v", err)
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	msg := *f.Msg
	msg.Queue = f.Queue
	if f.UniqueTTL > 0 {
		msg.UniqueKey = keys.Unique(msg.Type, msg.Payload)
	}
	start := len(*msgs)
	enc, err := AppendTaskMessage(*msgs, &msg)
	if err != nil {
		return bad("%v", err)
	}
	// Capped: a later append never writes into this fire's message, even
	// when the buffer has room after it.
	*msgs = enc
	return preparedFire{f: f, msg: enc[start:len(enc):len(enc)], id: msg.ID, group: msg.GroupKey, keys: keys}, nil
}

func checkRecord(name string, r Record, required bool) error {
	if r.empty() {
		if required {
			return fmt.Errorf("missing %s record", name)
		}
		return nil
	}
	if r.ID == "" || len(r.Data) == 0 {
		return fmt.Errorf("%s record needs both an event id and data", name)
	}
	return nil
}
