package taskstate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// EntryKey is one of cronstream's per-entry keys (a watermark, a handover
// marker, a fires counter or a held tick in one queue's slot), or an
// entry's field in a slot's restore proposals, as a sweep found it.
type EntryKey struct {
	Key   string
	Queue string
	Entry string
	// Value is the key's value when it was read (a held tick's: its task
	// id; a restore proposal's: the field's): the key is deleted only if it
	// still holds it (a proposal: its tick) (DeleteRemovedEntryKeys).
	Value string
	// heldIndex is the slot's held-tick index when Key is a held tick
	// (OwnKeys.Held), which loses it with the key.
	heldIndex string
	// proposal: Key is the slot's restore proposals (OwnKeys.Restore) and
	// Entry the field.
	proposal bool
}

// scanCount is the COUNT hint of each SCAN call: how many slots of the
// keyspace one call walks, so that no call blocks Redis for long.
const scanCount = 1000

// ScanEntryKeys walks the keyspace of every master (each node of a Redis
// Cluster) for the per-entry keys of tenant prefix in any queue slot, keeps
// those whose entry want accepts (nil: all) and returns at most limit of
// them (0: no limit) with their values. The restore proposals of each slot
// it finds add their entries' fields: a proposal of an entry removed before
// its restore settled is never cleared otherwise. SCAN may return a key
// twice; the result is deduplicated.
func (s *Store) ScanEntryKeys(ctx context.Context, prefix string, want func(entry string) bool, limit int) ([]EntryKey, error) {
	var (
		mu        sync.Mutex
		found     = map[string]EntryKey{}
		restores  = map[string]string{} // restore proposals key -> queue
		proposals = map[[2]string]EntryKey{}
	)
	full := func() bool { return limit > 0 && len(found)+len(proposals) >= limit }
	pattern := EntryKeyPattern(prefix)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return fmt.Errorf("scan %s: %w", pattern, err)
			}
			mu.Lock()
			for _, k := range keys {
				if q, ok := restoreQueue(prefix, k); ok {
					restores[k] = q
					continue
				}
				q, e, ok := ParseEntryKey(prefix, k)
				if !ok || (want != nil && !want(e)) || full() {
					continue
				}
				ek := EntryKey{Key: k, Queue: q, Entry: e}
				if own := Own(prefix, q); own.Held(e) == k {
					ek.heldIndex = own.HeldIndex()
				}
				found[k] = ek
			}
			stop := full()
			mu.Unlock()
			if next == 0 || stop {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return nil, err
	}
	for key, q := range restores {
		var cursor uint64
		for !full() {
			kv, next, err := s.client.HScan(ctx, key, cursor, "*", scanCount).Result()
			if err != nil {
				return nil, fmt.Errorf("scan %s: %w", key, err)
			}
			for i := 0; i+1 < len(kv) && !full(); i += 2 {
				if e := kv[i]; want == nil || want(e) {
					proposals[[2]string{key, e}] = EntryKey{Key: key, Queue: q, Entry: e, Value: kv[i+1], proposal: true}
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	if len(found)+len(proposals) == 0 {
		return nil, nil
	}
	out := make([]EntryKey, 0, len(found))
	cmds := make([]*redis.StringCmd, 0, len(found))
	pipe := s.client.Pipeline()
	for _, k := range found {
		out = append(out, k)
		if k.heldIndex != "" {
			cmds = append(cmds, pipe.HGet(ctx, k.Key, "task"))
		} else {
			cmds = append(cmds, pipe.Get(ctx, k.Key))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read per-entry keys: %w", err)
	}
	kept := out[:0]
	for i, c := range cmds {
		if v, err := c.Result(); err == nil {
			out[i].Value = v
			kept = append(kept, out[i])
		}
	}
	for _, k := range proposals {
		kept = append(kept, k) // read with its hash
	}
	return kept, nil
}

// DeleteRemovedEntryKeys deletes the per-entry keys of one removed entry
// (keys from ScanEntryKeys, all of the same entry; a held tick leaves its
// slot's held index too; a restore proposal goes if it still proposes the
// tick the scan read, as ClearRestore does) and the entry's asynq
// scheduler history from before removedAt, and returns how many keys it
// deleted. Each queue slot's keys go in one script that deletes a key only
// if it still holds the value the scan read, so a key a re-registration of
// the entry has written since is kept; history events recorded after the
// removal are kept too.
func (s *Store) DeleteRemovedEntryKeys(ctx context.Context, keys []EntryKey, removedAt time.Time) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	entry := keys[0].Entry
	bySlot := map[string][]EntryKey{}
	var proposals []EntryKey
	for _, k := range keys {
		switch {
		case k.Entry != entry:
			return 0, fmt.Errorf("delete keys of entry %q: key %s is of entry %q", entry, k.Key, k.Entry)
		case k.proposal:
			proposals = append(proposals, k)
		default:
			bySlot[k.Queue] = append(bySlot[k.Queue], k)
		}
	}
	deleted := 0
	for _, k := range proposals {
		tick, _, _ := strings.Cut(k.Value, " ")
		n, err := clearRestoreScript.Run(ctx, s.client, []string{k.Key}, k.Entry, tick).Int()
		if err != nil {
			return deleted, fmt.Errorf("delete the restore proposal of removed entry %q in queue %q: %w", entry, k.Queue, err)
		}
		deleted += n
	}
	for queue, ks := range bySlot {
		names := make([]string, len(ks), len(ks)+1)
		values := make([]any, len(ks))
		index := ""
		for i, k := range ks {
			names[i], values[i] = k.Key, k.Value
			index = cmp.Or(index, k.heldIndex)
		}
		if index != "" {
			names = append(names, index)
		}
		reply, err := runScript(ctx, s.client, deleteUnchangedScript, names, values...)
		if err != nil {
			return deleted, fmt.Errorf("delete keys of removed entry %q in queue %q: %w", entry, queue, err)
		}
		if n, ok := reply[0].(int64); ok {
			deleted += int(n)
		}
	}
	history := SchedulerHistoryKey(entry)
	pipe := s.client.Pipeline()
	trimmed := pipe.ZRemRangeByScore(ctx, history, "-inf", strconv.FormatInt(removedAt.Unix(), 10))
	left := pipe.Exists(ctx, history)
	if _, err := pipe.Exec(ctx); err != nil {
		return deleted, fmt.Errorf("delete scheduler history of removed entry %q: %w", entry, err)
	}
	if trimmed.Val() > 0 && left.Val() == 0 {
		deleted++
	}
	return deleted, nil
}
