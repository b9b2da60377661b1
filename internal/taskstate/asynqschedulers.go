package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reading what asynq's schedulers publish: the lists `cronstream import
// asynq` converts into entries, and the enqueue history its cutover reads.
// Nothing here writes, except the history capture (historycapture.go).

// SchedulerIDOfKey returns the scheduler id of a member of asynq:schedulers
// ("asynq:schedulers:{<id>}"); ok is false for anything else.
func SchedulerIDOfKey(key string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(key, "asynq:schedulers:{")
	if !ok || !strings.HasSuffix(rest, "}") || len(rest) < 2 {
		return "", false
	}
	return rest[:len(rest)-1], true
}

// IsOwnSchedulerID reports whether a scheduler id is one cronstream lists
// its entries under, of any tenant: the shared SchedulerID of earlier
// builds or a replica's ReplicaSchedulerID. An asynq scheduler's id on a
// host named "cronstream" is not (parseSchedulerID says why).
func IsOwnSchedulerID(id string) bool {
	_, _, ok := parseSchedulerID(id)
	return ok
}

// ListedScheduler is one scheduler in asynq:schedulers and the entries of
// its list.
type ListedScheduler struct {
	ID  string
	Key string
	// Expires is the list's score: when readers drop it unless the
	// scheduler's heartbeat writes it again (asynq: now + 2 heartbeats).
	Expires time.Time
	// Exists: the list key is there (false once it expired or the
	// scheduler cleared it at shutdown).
	Exists  bool
	Entries []SchedulerEntry
	// Bad are the list's elements that do not decode, each with why.
	Bad []error
}

// ListSchedulers returns every scheduler listed in asynq:schedulers with
// its entries, cronstream's own included (IsOwnSchedulerID tells them
// apart), in the set's order. Unlike asynq's Inspector it removes nothing:
// members whose list expired are returned with Exists false.
func (s *Store) ListSchedulers(ctx context.Context) ([]ListedScheduler, error) {
	zs, err := s.client.ZRangeWithScores(ctx, AllSchedulersKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", AllSchedulersKey, err)
	}
	out := make([]ListedScheduler, 0, len(zs))
	pipe := s.client.Pipeline()
	lists := make([]*redis.StringSliceCmd, 0, len(zs))
	exists := make([]*redis.IntCmd, 0, len(zs))
	for _, z := range zs {
		key, _ := z.Member.(string)
		id, ok := SchedulerIDOfKey(key)
		if !ok {
			continue // not a scheduler list asynq or cronstream writes
		}
		out = append(out, ListedScheduler{ID: id, Key: key, Expires: time.Unix(int64(z.Score), 0).UTC()})
		lists = append(lists, pipe.LRange(ctx, key, 0, -1))
		exists = append(exists, pipe.Exists(ctx, key))
	}
	if len(out) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read scheduler lists: %w", err)
	}
	for i := range out {
		out[i].Exists = exists[i].Val() == 1
		for _, raw := range lists[i].Val() {
			e, err := DecodeSchedulerEntry([]byte(raw))
			if err != nil {
				out[i].Bad = append(out[i].Bad, err)
				continue
			}
			out[i].Entries = append(out[i].Entries, *e)
		}
	}
	return out, nil
}

// SchedulerHistory returns an asynq scheduler entry's enqueue history
// (asynq:scheduler_history:<entry id>), oldest first, and the members
// that do not decode.
func (s *Store) SchedulerHistory(ctx context.Context, entryID string) ([]SchedulerEnqueueEvent, []error, error) {
	raw, err := s.client.ZRange(ctx, SchedulerHistoryKey(entryID), 0, -1).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read enqueue history of %q: %w", entryID, err)
	}
	evs, bad := decodeHistory(raw)
	return evs, bad, nil
}

func decodeHistory(raw []string) ([]SchedulerEnqueueEvent, []error) {
	var out []SchedulerEnqueueEvent
	var bad []error
	for _, m := range raw {
		ev, err := DecodeSchedulerEnqueueEvent([]byte(m))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, *ev)
	}
	return out, bad
}
