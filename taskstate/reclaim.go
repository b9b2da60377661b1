package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// StaleAggregationSet is an aggregation set whose deadline passed without the
// aggregator deleting it: its aggregator died mid-run (docs/asynq-compat.md "Aggregation sets").
type StaleAggregationSet struct {
	Queue string
	Group string
	SetID string
	// Key is the set's full key, asynq:{<queue>}:g:<group>:<setID>.
	Key string
	// Deadline is the set's score in aggregation_sets.
	Deadline time.Time
	// TaskIDs are the set's members, lowest score first.
	TaskIDs []string
}

// Reclaimed is one stale aggregation set returned to its group.
type Reclaimed struct {
	StaleAggregationSet
	// Tasks is how many task ids went back into the group.
	Tasks int
	// StreamID is the outbox stream id of the set's record.
	StreamID string
}

// ReclaimRecordFunc builds the outbox record for one stale set before it is
// reclaimed. The record is written only if the reclaim happens.
type ReclaimRecordFunc func(StaleAggregationSet) (Record, error)

// reclaimPage is how many stale sets one listing reads.
const reclaimPage = 100

// ReclaimStaleAggregationSets reclaims every aggregation set of queue whose
// deadline is at or before now. For each set it calls record to build the
// outbox record (prefix's outbox of queue), then runs one script that
// re-checks the set is still stale and moves it and writes the record in one
// step, so concurrent reclaimers reclaim each set once and record it once. A
// listed set whose key is already gone is just unlisted, without a record.
//
// A set whose key does not have the queue's group prefix, or whose record
// cannot be built, is skipped and reported in the returned error; the other
// sets are still reclaimed.
func (s *Store) ReclaimStaleAggregationSets(ctx context.Context, prefix, queue string, now time.Time, record ReclaimRecordFunc) ([]Reclaimed, error) {
	if err := s.CheckQueue(queue); err != nil {
		return nil, err
	}
	if record == nil {
		return nil, fmt.Errorf("reclaim aggregation sets of queue %q: nil record builder", queue)
	}
	k := Keys(queue)
	outbox := Own(prefix, queue).Outbox()
	var (
		out      []Reclaimed
		errs     []error
		seen     = make(map[string]struct{})
		register = true
	)
	for {
		page, err := s.client.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: k.AggregationSets(), Start: "-inf", Stop: strconv.FormatInt(now.Unix(), 10),
			ByScore: true, Count: reclaimPage,
		}).Result()
		if err != nil {
			return out, fmt.Errorf("list stale aggregation sets of queue %q: %w", queue, err)
		}
		fresh := 0
		for _, z := range page {
			key, _ := z.Member.(string)
			if _, dup := seen[key]; dup {
				continue
			}
			seen[key] = struct{}{}
			fresh++
			set, err := parseAggregationSetKey(k, key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			set.Deadline = time.Unix(int64(z.Score), 0)
			if set.TaskIDs, err = s.client.ZRange(ctx, key, 0, -1).Result(); err != nil {
				return out, errors.Join(append(errs, fmt.Errorf("read aggregation set %q: %w", key, err))...)
			}
			var rec Record
			if len(set.TaskIDs) > 0 {
				if rec, err = record(set); err != nil {
					errs = append(errs, fmt.Errorf("aggregation set %q: build record: %w", key, err))
					continue
				}
				if rec.ID == "" || len(rec.Data) == 0 {
					errs = append(errs, fmt.Errorf("aggregation set %q: record needs an event id and data", key))
					continue
				}
				if register {
					if err := s.RegisterOutbox(ctx, prefix, queue); err != nil {
						return out, errors.Join(append(errs, err)...)
					}
					register = false
				}
			}
			reply, err := runScript(ctx, s.client, reclaimScript,
				[]string{k.AggregationSets(), key, k.Group(set.Group), k.Groups(), outbox},
				now.Unix(), set.Group, rec.ID, rec.Data)
			if err != nil {
				return out, errors.Join(append(errs, fmt.Errorf("reclaim aggregation set %q: %w", key, err))...)
			}
			n, _ := reply[0].(int64)
			xid, _ := reply[1].(string)
			if n > 0 {
				out = append(out, Reclaimed{StaleAggregationSet: set, Tasks: int(n), StreamID: xid})
			}
		}
		if fresh == 0 || len(page) < reclaimPage {
			return out, errors.Join(errs...)
		}
	}
}

// parseAggregationSetKey splits asynq:{<q>}:g:<group>:<setID>. Group names
// may contain ':', so the set id is the last segment, as in asynq.
func parseAggregationSetKey(k QueueKeys, key string) (StaleAggregationSet, error) {
	rest, ok := strings.CutPrefix(key, k.GroupPrefix())
	i := strings.LastIndexByte(rest, ':')
	if !ok || i <= 0 || i == len(rest)-1 {
		return StaleAggregationSet{}, fmt.Errorf("aggregation set key %q is not of queue %q", key, k.Queue())
	}
	return StaleAggregationSet{Queue: k.Queue(), Group: rest[:i], SetID: rest[i+1:], Key: key}, nil
}
