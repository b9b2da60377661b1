package taskstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WatermarkInfo is one entry's watermark as Watermarks reads it.
type WatermarkInfo struct {
	Tick   time.Time
	TaskID string
	OK     bool // false: the entry never fired in this queue
}

// watermarkChunk bounds the keys of one MGET.
const watermarkChunk = 1000

// Watermarks reads the watermarks of many entries of one queue, in one
// round trip per thousand entries (the keys share the queue's slot, so a
// single MGET works on a cluster too). The result is in the order of
// entries.
func (s *Store) Watermarks(ctx context.Context, prefix, queue string, entries []string) ([]WatermarkInfo, error) {
	own := Own(prefix, queue)
	out := make([]WatermarkInfo, len(entries))
	for start := 0; start < len(entries); start += watermarkChunk {
		end := min(start+watermarkChunk, len(entries))
		keys := make([]string, 0, end-start)
		for _, e := range entries[start:end] {
			keys = append(keys, own.Watermark(e))
		}
		vals, err := s.client.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, fmt.Errorf("read %d watermarks in queue %q: %w", len(keys), queue, err)
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok {
				continue
			}
			tick, task, err := parseWatermark(str)
			if err != nil {
				return nil, fmt.Errorf("watermark of entry %q in queue %q: %w", entries[start+i], queue, err)
			}
			out[start+i] = WatermarkInfo{Tick: tick, TaskID: task, OK: true}
		}
	}
	return out, nil
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

// Time returns Redis's clock (TIME), the one clock every replica corrects
// its own by.
func (s *Store) Time(ctx context.Context) (time.Time, error) {
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis TIME: %w", err)
	}
	return t, nil
}
