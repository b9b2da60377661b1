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

// ArchivedTask is one member of a queue's archived set: a task whose
// retries ran out, archived by an asynq worker or by the recoverer. At is
// its score there, the archive time in whole seconds, as both write it
// (docs/asynq-compat.md "Retry and archive").
type ArchivedTask struct {
	ID string
	At time.Time
}

// ArchivedSince lists the members of queue's archived set archived at or
// after from (whole seconds), oldest first, skipping the first skip of them
// and returning at most limit. A caller reads a large set incrementally by
// remembering the last score it saw.
func (s *Store) ArchivedSince(ctx context.Context, queue string, from time.Time, skip, limit int) ([]ArchivedTask, error) {
	zs, err := s.client.ZRangeByScoreWithScores(ctx, Keys(queue).Archived(), &redis.ZRangeBy{
		Min: strconv.FormatInt(from.Unix(), 10), Max: "+inf", Offset: int64(skip), Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("list archived tasks of queue %q: %w", queue, err)
	}
	out := make([]ArchivedTask, 0, len(zs))
	for _, z := range zs {
		id, ok := z.Member.(string)
		if !ok {
			continue
		}
		out = append(out, ArchivedTask{ID: id, At: time.Unix(int64(z.Score), 0).UTC()})
	}
	return out, nil
}

// ArchivedMessages reads the task messages of ids in queue in one pipelined
// round trip. A task whose hash is gone (trimmed, deleted) or whose message
// does not decode is nil in the result, with the decode error in errs at the
// same index; the error return is for Redis failing.
func (s *Store) ArchivedMessages(ctx context.Context, queue string, ids []string) (msgs []*TaskMessage, errs []error, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	k := Keys(queue)
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGet(ctx, k.Task(id), "msg")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("read archived tasks of queue %q: %w", queue, err)
	}
	msgs, errs = make([]*TaskMessage, len(ids)), make([]error, len(ids))
	for i, c := range cmds {
		b, err := c.Bytes()
		switch {
		case errors.Is(err, redis.Nil):
			errs[i] = fmt.Errorf("task %s: hash gone", ids[i])
		case err != nil:
			return nil, nil, fmt.Errorf("read archived task %s: %w", ids[i], err)
		default:
			msgs[i], errs[i] = DecodeTaskMessage(b)
		}
	}
	return msgs, errs, nil
}

// maxBusyList bounds the ids HasBusyTask reads of a pending or active list.
const maxBusyList = 10000

// HasBusyTask reports whether queue holds a task whose id starts with
// idPrefix that is still pending, active, scheduled or retrying: one that
// may yet be archived there. The sorted sets are matched by Redis (ZSCAN
// MATCH); the lists are read up to maxBusyList ids each, and a longer list
// counts as holding one (the caller asks again later).
func (s *Store) HasBusyTask(ctx context.Context, queue, idPrefix string) (bool, error) {
	k := Keys(queue)
	for _, set := range []string{k.Scheduled(), k.Retry()} {
		it := s.client.ZScan(ctx, set, 0, globEscape(idPrefix)+"*", 1000).Iterator()
		for it.Next(ctx) {
			return true, nil
		}
		if err := it.Err(); err != nil {
			return false, fmt.Errorf("busy tasks of %q in queue %q: %w", idPrefix, queue, err)
		}
	}
	for _, list := range []string{k.Pending(), k.Active()} {
		ids, err := s.client.LRange(ctx, list, 0, maxBusyList).Result()
		if err != nil {
			return false, fmt.Errorf("busy tasks of %q in queue %q: %w", idPrefix, queue, err)
		}
		if len(ids) > maxBusyList {
			return true, nil
		}
		for _, id := range ids {
			if strings.HasPrefix(id, idPrefix) {
				return true, nil
			}
		}
	}
	return false, nil
}
