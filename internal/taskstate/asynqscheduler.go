package taskstate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
)

// asynq cron visibility: the records asynq's Scheduler writes so that
// `asynq cron ls`, `asynq cron history`, asynqmon and the Inspector show
// periodic entries (docs/asynq-compat.md "Scheduler entries and history");
// cronstream writes them for its own entries. Each replica lists the entries
// of the shards it owns under a scheduler id of its own
// (ReplicaSchedulerID), as each asynq scheduler lists its own; replicas of
// builds before shard ownership shared one id per tenant (SchedulerID).

// PausedSpecPrefix marks a paused entry's spec in asynq's scheduler entries:
// asynq's SchedulerEntry has no paused field, and the spec is the column
// `asynq cron ls` and asynqmon show in full, so the mark leads it.
const PausedSpecPrefix = "paused: "

// PausedSpec is spec as listed for a paused entry ("paused: @every 10s").
func PausedSpec(spec string) string { return PausedSpecPrefix + spec }

// MaxSchedulerHistory is asynq's cap on enqueue events kept per entry.
const MaxSchedulerHistory = 1000

// schedulerIDHead leads every scheduler id cronstream lists entries under.
const schedulerIDHead = "cronstream:"

// SchedulerID is the scheduler id replicas of tenant prefix wrote their
// entries under before shard ownership, all the same list (replicas of
// earlier builds still do).
func SchedulerID(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return schedulerIDHead + prefix
}

// ReplicaSchedulerID is the scheduler id one replica of tenant prefix
// writes the entries of the shards it owns under, as each asynq scheduler
// writes its own.
func ReplicaSchedulerID(prefix, replica string) string { return SchedulerID(prefix) + ":" + replica }

// parseSchedulerID reads an id SchedulerID ("cronstream:<prefix>") or
// ReplicaSchedulerID ("cronstream:<prefix>:<replica id>") makes: ok with
// its prefix and, for the second form, its replica id; ok is false for
// any other id. Neither a prefix nor a replica id holds ':'
// (contract.NewNames, contract.ValidateReplicaID), so the parts are
// unambiguous.
//
// An asynq scheduler's id is "<host>:<pid>:<uuid>". On a host named
// "cronstream" it fits the second form too: a decimal pid is a valid
// prefix and a UUID a valid replica id, so the grammar cannot tell them
// apart. Such an id is taken for asynq's: read as ours, its entries would
// silently be left out of an import and its cutover would not wait for
// it, while the reverse (a tenant whose prefix is only digits and whose
// replica ids are UUIDs) shows its lists among asynq's schedulers, where
// the operator sees them.
func parseSchedulerID(id string) (prefix, replica string, ok bool) {
	rest, ok := strings.CutPrefix(id, schedulerIDHead)
	if !ok {
		return "", "", false
	}
	prefix, replica, perReplica := strings.Cut(rest, ":")
	// NewNames takes "" for the default prefix, which SchedulerID spells.
	if _, err := contract.NewNames(prefix); prefix == "" || err != nil {
		return "", "", false
	}
	if !perReplica {
		return prefix, "", true
	}
	if contract.ValidateReplicaID(replica) != nil || isDecimal(prefix) && isUUID(replica) {
		return "", "", false
	}
	return prefix, replica, true
}

func isDecimal(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// isUUID reports whether s is a UUID as asynq writes it in a scheduler id
// (8-4-4-4-12 hex digits), in either case; uuid.Validate alone also takes
// the braced, URN and undashed forms.
func isUUID(s string) bool { return len(s) == 36 && uuid.Validate(s) == nil }

// WriteSchedulerEntries publishes entries under schedulerID for ttl, as
// asynq's scheduler heartbeat does: a plain ZADD of the list key into
// asynq:schedulers scored now+ttl (readers drop it after that), then one
// script replacing the list. ttl is rounded up to whole seconds. An entry that
// cannot be encoded is left out and reported in the returned error (wrapping
// ErrMalformed) after the others were written.
//
// Replicas sharing schedulerID should write the same entries; calling this on
// every replica's heartbeat is what keeps them listed.
func (s *Store) WriteSchedulerEntries(ctx context.Context, schedulerID string, entries []SchedulerEntry, ttl time.Duration) error {
	secs := int64(math.Ceil(ttl.Seconds()))
	if secs < 1 {
		return fmt.Errorf("write scheduler entries of %q: ttl %s below 1s", schedulerID, ttl)
	}
	args := make([]any, 0, len(entries)+1)
	args = append(args, secs)
	// Every entry is encoded into one buffer, each passed as a slice of it.
	size := 0
	for i := range entries {
		size += schedulerEntrySize(&entries[i])
	}
	encoded := make([]byte, 0, size)
	var bad []error
	for i := range entries {
		from := len(encoded)
		var err error
		if encoded, err = appendSchedulerEntry(encoded, &entries[i]); err != nil {
			bad = append(bad, fmt.Errorf("entry %q: %w", entries[i].ID, err))
			continue
		}
		args = append(args, encoded[from:len(encoded):len(encoded)])
	}
	key := SchedulerEntriesKey(schedulerID)
	expiry := time.Now().Add(time.Duration(secs) * time.Second).Unix()
	if err := s.client.ZAdd(ctx, AllSchedulersKey, redis.Z{Score: float64(expiry), Member: key}).Err(); err != nil {
		return fmt.Errorf("write scheduler entries of %q: %w", schedulerID, err)
	}
	if err := writeSchedulerEntriesScript.Run(ctx, s.client, []string{key}, args...).Err(); err != nil {
		return fmt.Errorf("write scheduler entries of %q: %w", schedulerID, err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("write scheduler entries of %q: skipped %d: %w", schedulerID, len(bad), errors.Join(bad...))
	}
	return nil
}

// ClearSchedulerEntries removes schedulerID's entries at once (asynq does so
// at scheduler shutdown). With a shared scheduler id only the last replica to
// stop should call it; otherwise the entries simply expire after their ttl.
func (s *Store) ClearSchedulerEntries(ctx context.Context, schedulerID string) error {
	key := SchedulerEntriesKey(schedulerID)
	if err := s.client.ZRem(ctx, AllSchedulersKey, key).Err(); err != nil {
		return fmt.Errorf("clear scheduler entries of %q: %w", schedulerID, err)
	}
	if err := s.client.Del(ctx, key).Err(); err != nil {
		return fmt.Errorf("clear scheduler entries of %q: %w", schedulerID, err)
	}
	return nil
}

// RecordSchedulerEnqueueEvent appends ev to entryID's enqueue history, keeping
// the newest MaxSchedulerHistory events, as asynq's scheduler does after each
// successful enqueue.
func (s *Store) RecordSchedulerEnqueueEvent(ctx context.Context, entryID string, ev SchedulerEnqueueEvent) error {
	b, err := EncodeSchedulerEnqueueEvent(&ev)
	if err != nil {
		return fmt.Errorf("record enqueue event of entry %q: %w", entryID, err)
	}
	err = recordSchedulerEventScript.Run(ctx, s.client, []string{SchedulerHistoryKey(entryID)},
		ev.EnqueueTime.Unix(), b, MaxSchedulerHistory).Err()
	if err != nil {
		return fmt.Errorf("record enqueue event of entry %q: %w", entryID, err)
	}
	return nil
}

// ClearSchedulerHistory deletes entryID's enqueue history (for a removed
// entry; asynq itself leaks these keys).
func (s *Store) ClearSchedulerHistory(ctx context.Context, entryID string) error {
	if err := s.client.Del(ctx, SchedulerHistoryKey(entryID)).Err(); err != nil {
		return fmt.Errorf("clear enqueue history of entry %q: %w", entryID, err)
	}
	return nil
}

// EnqueueOptions are an entry's task options as asynq's Scheduler would show
// them. Strings formats them in asynq's Option.String() form.
type EnqueueOptions struct {
	Queue     string
	MaxRetry  int
	Timeout   time.Duration
	Deadline  time.Time
	Unique    time.Duration
	Retention time.Duration
	Group     string
}

// Strings returns the options in asynq's Option.String() forms, in asynq's
// option order: Queue("x"), MaxRetry(3), Timeout(30m0s), Deadline(<UnixDate>),
// Unique(1h0m0s), Retention(24h0m0s), Group("g"). Zero values are left out,
// except MaxRetry. Every string contains '(' — asynq's Inspector panics on
// one that does not.
func (o EnqueueOptions) Strings() []string {
	var out []string
	if o.Queue != "" {
		out = append(out, "Queue("+strconv.Quote(o.Queue)+")")
	}
	out = append(out, "MaxRetry("+strconv.Itoa(max(o.MaxRetry, 0))+")")
	if o.Timeout > 0 {
		out = append(out, "Timeout("+o.Timeout.String()+")")
	}
	if !o.Deadline.IsZero() {
		out = append(out, "Deadline("+o.Deadline.Format(time.UnixDate)+")")
	}
	if o.Unique > 0 {
		out = append(out, "Unique("+o.Unique.String()+")")
	}
	if o.Retention > 0 {
		out = append(out, "Retention("+o.Retention.String()+")")
	}
	if o.Group != "" {
		out = append(out, "Group("+strconv.Quote(o.Group)+")")
	}
	return out
}

// EnqueueEventRecord is one asynq enqueue-history event of one entry.
type EnqueueEventRecord struct {
	Entry string
	Event SchedulerEnqueueEvent
	// Trim cuts the entry's history to the newest MaxSchedulerHistory
	// after this event. A writer that records every fire may trim on
	// every k-th record of an entry only: the history then holds at most
	// k-1 events more between trims, and Redis is spared a command per
	// fire.
	Trim bool
}

// RecordSchedulerEnqueueEvents appends many history events in one pipeline,
// with RecordSchedulerEnqueueEvent's result for each record with Trim set:
// the newest MaxSchedulerHistory events are kept. History keys are global (no hash
// tag), so each event is written with plain commands, ZADD then a trim to
// the newest MaxSchedulerHistory, rather than a script: this runs for every
// fire, and two plain commands cost Redis less than a script call. The pair
// is not atomic, which only matters to a reader that counts the history
// while a fire is being recorded (it may see one event more).
func (s *Store) RecordSchedulerEnqueueEvents(ctx context.Context, recs []EnqueueEventRecord) error {
	if len(recs) == 0 {
		return nil
	}
	pipe := s.client.Pipeline()
	for _, r := range recs {
		b, err := EncodeSchedulerEnqueueEvent(&r.Event)
		if err != nil {
			continue // a task id that is not UTF-8 cannot come from us
		}
		key := SchedulerHistoryKey(r.Entry)
		pipe.ZAdd(ctx, key, redis.Z{Score: float64(r.Event.EnqueueTime.Unix()), Member: b})
		if r.Trim {
			pipe.ZRemRangeByRank(ctx, key, 0, -MaxSchedulerHistory-1)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("record %d enqueue events: %w", len(recs), err)
	}
	return nil
}
