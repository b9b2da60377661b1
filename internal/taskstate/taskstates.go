package taskstate

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// StateGone is what TaskStates reports for a task whose hash no longer
// exists: deleted, or expired after its retention.
const StateGone = "gone"

// TaskRef names one task.
type TaskRef struct {
	Queue, ID string
}

// TaskStates reads each task's current state from its hash's "state"
// field, as asynq's Inspector does: pending, active, scheduled, retry,
// archived, completed, aggregating, or StateGone. One pipelined round trip
// (a cluster client splits it by slot).
func (s *Store) TaskStates(ctx context.Context, tasks []TaskRef) ([]string, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(tasks))
	for i, t := range tasks {
		cmds[i] = pipe.HGet(ctx, Keys(t.Queue).Task(t.ID), "state")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read task states: %w", err)
	}
	out := make([]string, len(tasks))
	for i, c := range cmds {
		v, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			out[i] = StateGone
		case err != nil:
			return nil, fmt.Errorf("read state of task %s: %w", tasks[i].ID, err)
		default:
			out[i] = v
		}
	}
	return out, nil
}
