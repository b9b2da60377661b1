package taskstate

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// QueueStats are one queue's sizes and counters as asynq's Inspector shows
// them, for `cronstream status`.
type QueueStats struct {
	Queue                                                  string
	Pending, Active, Scheduled, Retry, Archived, Completed int64
	// Processed and Failed are asynq's all-time counters; the Today ones
	// its daily counters for the UTC date of the read.
	Processed, Failed           int64
	ProcessedToday, FailedToday int64
	Paused                      bool
}

// QueueStats reads queue's sizes and counters in one round trip (every key
// is in the queue's slot). Plain reads: the numbers are a moment's view,
// not a consistent snapshot, which is all a status display needs.
func (s *Store) QueueStats(ctx context.Context, queue string) (QueueStats, error) {
	k := Keys(queue)
	now := s.now()
	pipe := s.client.Pipeline()
	pending := pipe.LLen(ctx, k.Pending())
	active := pipe.LLen(ctx, k.Active())
	scheduled := pipe.ZCard(ctx, k.Scheduled())
	retry := pipe.ZCard(ctx, k.Retry())
	archived := pipe.ZCard(ctx, k.Archived())
	completed := pipe.ZCard(ctx, k.Completed())
	processed := pipe.Get(ctx, k.ProcessedTotal())
	failed := pipe.Get(ctx, k.FailedTotal())
	processedToday := pipe.Get(ctx, k.Processed(now))
	failedToday := pipe.Get(ctx, k.Failed(now))
	paused := pipe.Exists(ctx, k.Paused())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return QueueStats{}, fmt.Errorf("stats of queue %q: %w", queue, err)
	}
	counter := func(c *redis.StringCmd) int64 {
		n, err := c.Int64()
		if err != nil {
			return 0 // missing (redis.Nil) or not a number: asynq shows 0 too
		}
		return n
	}
	return QueueStats{
		Queue: queue, Pending: pending.Val(), Active: active.Val(), Scheduled: scheduled.Val(),
		Retry: retry.Val(), Archived: archived.Val(), Completed: completed.Val(),
		Processed: counter(processed), Failed: counter(failed),
		ProcessedToday: counter(processedToday), FailedToday: counter(failedToday),
		Paused: paused.Val() > 0,
	}, nil
}
