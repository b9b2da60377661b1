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

// An entry's watermark is its last fired or skipped tick in one queue's
// slot, "<tick unix ms> <task id>" (OwnKeys.Watermark): the fire script's
// compare-and-set value (docs/invariants.md INV-watermark).

// Watermark returns entry's watermark in queue's slot: its last fired or
// skipped tick and the task id stored with it. ok is false when the entry
// never fired there.
func (s *Store) Watermark(ctx context.Context, prefix, queue, entry string) (tick time.Time, taskID string, ok bool, err error) {
	v, err := s.client.Get(ctx, Own(prefix, queue).Watermark(entry)).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, "", false, nil
	}
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("read watermark of entry %q in queue %q: %w", entry, queue, err)
	}
	tick, taskID, err = parseWatermark(v)
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("read watermark of entry %q in queue %q: %w", entry, queue, err)
	}
	return tick, taskID, true, nil
}

// parseWatermark reads the stored form "<tick unix ms> <task id>".
func parseWatermark(v string) (time.Time, string, error) {
	msPart, taskID, _ := strings.Cut(v, " ")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("malformed watermark %q", v)
	}
	return time.UnixMilli(ms).UTC(), taskID, nil
}

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
