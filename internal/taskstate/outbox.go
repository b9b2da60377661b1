package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/redisscript"
)

// Each queue slot has one outbox: a Redis Stream (OwnKeys.Outbox) of records
// appended by the same scripts that change task state, so "task changed in
// Redis" and "record to publish" are one fact. Records carry two fields: "id"
// (the event id, later the Nats-Msg-Id) and "data" (the CloudEvent JSON, or
// for a scheduled tick's fired event the compact form of
// internal/outbox.AppendFiredRecord, which the relay expands).
//
// One relay at a time owns an outbox (a lease key, OwnKeys.OutboxOwner, in
// the same slot). It reads records in stream order, publishes them, and
// deletes them only after JetStream acknowledged them. The stream is read
// with XRANGE and trimmed with XDEL, not through a consumer group: the lease
// already gives one reader, and a new owner resumes from the first record
// still in the stream, which is by construction the first unacknowledged one.
// Acknowledging checks the lease inside the script, so an owner that lost its
// lease cannot delete records the new owner has not published yet.

// ErrNotOwner reports an outbox operation by a relay that does not hold the
// outbox's lease (it expired, or another relay took it).
var ErrNotOwner = errors.New("not the outbox owner")

// OutboxRecord is one record read from an outbox.
type OutboxRecord struct {
	// StreamID is the record's Redis Stream id, used to acknowledge it.
	StreamID string
	// EventID is the CloudEvent id (Nats-Msg-Id).
	EventID string
	// Data is the encoded CloudEvent or its compact form (internal/outbox.FormOf).
	Data []byte
}

// OutboxesKey is the SET of queues that have (or had) an outbox under tenant
// prefix, so a relay can find every outbox. It has no hash tag and is only
// written with plain commands beside scripts.
func OutboxesKey(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return "cronstream:outboxes:" + prefix
}

// RegisterOutbox adds queue to the tenant's set of queues with an outbox.
// FireOnce and FireBatch do it themselves; other writers of an outbox (the
// recoverer) call it beside their script.
func (s *Store) RegisterOutbox(ctx context.Context, prefix, queue string) error {
	if err := s.client.SAdd(ctx, OutboxesKey(prefix), queue).Err(); err != nil {
		return fmt.Errorf("register outbox of queue %q: %w", queue, err)
	}
	return nil
}

// OutboxQueues lists the queues with an outbox under prefix.
func (s *Store) OutboxQueues(ctx context.Context, prefix string) ([]string, error) {
	qs, err := s.client.SMembers(ctx, OutboxesKey(prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("list outbox queues: %w", err)
	}
	return qs, nil
}

// OutboxLen is the number of records in queue's outbox not yet acknowledged.
func (s *Store) OutboxLen(ctx context.Context, prefix, queue string) (int64, error) {
	n, err := s.client.XLen(ctx, Own(prefix, queue).Outbox()).Result()
	if err != nil {
		return 0, fmt.Errorf("outbox length of queue %q: %w", queue, err)
	}
	return n, nil
}

// OutboxRecordBytes is what one fire's record takes in an outbox, rounded
// up from the fired record of a scheduled tick measured with MEMORY USAGE
// (figure and method in docs/operations.md, "NATS outages"). It converts
// record counts to bytes where Redis cannot be asked (MEMORY USAGE refused;
// at least this per record) and for the deprecated --max-outbox.
const OutboxRecordBytes = 256

// ErrMemoryUsageRefused reports a Redis that refuses MEMORY USAGE (an ACL
// without it, a proxy that does not forward it).
var ErrMemoryUsageRefused = errors.New("Redis refuses MEMORY USAGE")

// OutboxBytes is the memory queue's outbox takes in Redis, as MEMORY USAGE
// estimates it from a few sampled nodes of the stream: cheap at any length.
// It is 0 when the outbox does not exist.
func (s *Store) OutboxBytes(ctx context.Context, prefix, queue string) (int64, error) {
	n, err := s.client.MemoryUsage(ctx, Own(prefix, queue).Outbox()).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case redis.HasErrorPrefix(err, "NOPERM"), err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command"):
		return 0, fmt.Errorf("outbox size of queue %q: %w: %w", queue, ErrMemoryUsageRefused, err)
	case err != nil:
		return 0, fmt.Errorf("outbox size of queue %q: %w", queue, err)
	}
	return n, nil
}

// OutboxFirstRecordBytes is the size of the oldest record in queue's
// outbox, its id and data, or 0 when it is empty: a rough measure of what
// its records hold where MEMORY USAGE is refused (a multi-record or a
// batch holds many events, a single record one).
func (s *Store) OutboxFirstRecordBytes(ctx context.Context, prefix, queue string) (int64, error) {
	recs, err := s.ReadOutbox(ctx, prefix, queue, "", 1)
	if err != nil || len(recs) == 0 {
		return 0, err
	}
	return int64(len(recs[0].EventID) + len(recs[0].Data)), nil
}

// AcquireOutbox takes queue's outbox lease for owner for ttl, or renews it
// when owner already holds it. It reports whether owner holds it now.
func (s *Store) AcquireOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration) (bool, error) {
	return s.outboxLease(ctx, acquireOutboxScript, "acquire", prefix, queue, owner, ttl)
}

// RenewOutbox extends owner's lease on queue's outbox for ttl while owner
// holds it, and reports whether it does; unlike AcquireOutbox it never
// takes a lease that is free (released, or lapsed).
func (s *Store) RenewOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration) (bool, error) {
	return s.outboxLease(ctx, renewOutboxScript, "renew", prefix, queue, owner, ttl)
}

// outboxLease runs script, which takes or extends queue's outbox lease for
// owner for ttl and answers 1 when owner holds it.
func (s *Store) outboxLease(ctx context.Context, script *redisscript.Script, verb, prefix, queue, owner string, ttl time.Duration) (bool, error) {
	if owner == "" || ttl < time.Millisecond {
		return false, fmt.Errorf("%s outbox of queue %q: empty owner or ttl below 1ms", verb, queue)
	}
	n, err := script.Run(ctx, s.client, []string{Own(prefix, queue).OutboxOwner()}, owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("%s outbox of queue %q for %q: %w", verb, queue, owner, err)
	}
	return n == 1, nil
}

// ReleaseOutbox gives up owner's lease on queue's outbox (a no-op when owner
// does not hold it), so another relay can take over at once.
func (s *Store) ReleaseOutbox(ctx context.Context, prefix, queue, owner string) error {
	own := Own(prefix, queue)
	if err := releaseOutboxScript.Run(ctx, s.client, []string{own.OutboxOwner()}, owner).Err(); err != nil {
		return fmt.Errorf("release outbox of queue %q by %q: %w", queue, owner, err)
	}
	return nil
}

// ReadOutbox returns up to count records of queue's outbox in order, starting
// after stream id after ("" = from the first record still there).
func (s *Store) ReadOutbox(ctx context.Context, prefix, queue, after string, count int) ([]OutboxRecord, error) {
	if count <= 0 {
		return nil, nil
	}
	// A generic reply rather than XRangeN's: the relay reads one record per
	// fire, and XRangeN's map per record was a tenth of a replica's
	// allocations (docs/benchmarks.md).
	reply, err := s.client.Do(ctx, "xrange", Own(prefix, queue).Outbox(), outboxStart(after), "+", "count", count).Slice()
	if err != nil {
		return nil, fmt.Errorf("read outbox of queue %q: %w", queue, err)
	}
	return outboxRecords(queue, reply)
}

// outboxRecords reads an XRANGE reply of queue's outbox.
func outboxRecords(queue string, reply []any) ([]OutboxRecord, error) {
	out := make([]OutboxRecord, 0, len(reply))
	for _, r := range reply {
		// Each entry is [stream id, [field, value, ...]]. Records are only
		// written by this package's scripts; one missing a field is still
		// returned (with empty fields) so the relay can report it instead
		// of stalling.
		entry, ok := r.([]any)
		if !ok || len(entry) != 2 {
			return nil, fmt.Errorf("read outbox of queue %q: unexpected entry %v", queue, r)
		}
		rec := OutboxRecord{}
		rec.StreamID, _ = entry[0].(string)
		fields, _ := entry[1].([]any)
		for i := 0; i+1 < len(fields); i += 2 {
			name, _ := fields[i].(string)
			value, _ := fields[i+1].(string)
			switch name {
			case "id":
				rec.EventID = value
			case "data":
				rec.Data = []byte(value)
			}
		}
		out = append(out, rec)
	}
	return out, nil
}

// AckOutbox deletes published records from queue's outbox and extends
// owner's lease for ttl, unless another relay holds the lease: then it
// returns ErrNotOwner and deletes nothing. A lease that lapsed and that
// nobody took is owner's again.
func (s *Store) AckOutbox(ctx context.Context, prefix, queue, owner string, ttl time.Duration, streamIDs ...string) error {
	if len(streamIDs) == 0 {
		return nil
	}
	if owner == "" || ttl < time.Millisecond {
		return fmt.Errorf("ack outbox records of queue %q: empty owner or ttl below 1ms", queue)
	}
	own := Own(prefix, queue)
	args := make([]any, 0, len(streamIDs)+2)
	args = append(args, owner, ttl.Milliseconds())
	for _, id := range streamIDs {
		args = append(args, id)
	}
	n, err := ackOutboxScript.Run(ctx, s.client, []string{own.OutboxOwner(), own.Outbox()}, args...).Int64()
	if err != nil {
		return fmt.Errorf("ack %d outbox records of queue %q: %w", len(streamIDs), queue, err)
	}
	if n < 0 {
		return fmt.Errorf("ack %d outbox records of queue %q by %q: %w", len(streamIDs), queue, owner, ErrNotOwner)
	}
	return nil
}
