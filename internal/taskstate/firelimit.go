package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// An entry with a fire limit (Fire.MaxFires) has a fires counter in its
// queue's slot, "<revision> <count>" (OwnKeys.Fires): the fire script reads
// and moves it in the step that creates the task it counts. A queue
// handover carries it to the new slot and a restore after Redis lost data
// rebuilds it (SeedFireCount), both only ever raising it.

// FireCount is an entry's fires counter: Count of its scheduled ticks
// created a task since revision Since.
type FireCount struct {
	Since uint64
	Count int
}

// FireCountUnknown is the count of a counter whose fires could not be
// counted (Redis lost data and the activity stream no longer holds every
// fire since the limit's revision): above any limit, so the fire script
// refuses every tick as completed until the limit changes, and exact as a
// Lua number.
const FireCountUnknown = 1 << 53

// Unknown reports whether c is a counter whose fires could not be counted
// (FireCountUnknown).
func (c FireCount) Unknown() bool { return c.Count >= FireCountUnknown }

// FireCount reads entry's fires counter in queue's slot; ok is false when
// there is none (the entry never fired there under a limit).
func (s *Store) FireCount(ctx context.Context, prefix, queue, entry string) (FireCount, bool, error) {
	v, err := s.client.Get(ctx, Own(prefix, queue).Fires(entry)).Result()
	if errors.Is(err, redis.Nil) {
		return FireCount{}, false, nil
	}
	if err != nil {
		return FireCount{}, false, fmt.Errorf("read fires counter of entry %q in queue %q: %w", entry, queue, err)
	}
	c, err := parseFireCount(v)
	if err != nil {
		return FireCount{}, false, fmt.Errorf("read fires counter of entry %q in queue %q: %w", entry, queue, err)
	}
	return c, true, nil
}

// FireCountRef names one entry's fires counter: the entry and its queue.
type FireCountRef struct{ Queue, Entry string }

// FireCounts reads the fires counters of several entries in one pipeline
// (one round trip per node, however many entries); ok[i] is false where
// refs[i] has no counter.
func (s *Store) FireCounts(ctx context.Context, prefix string, refs []FireCountRef) (counts []FireCount, ok []bool, err error) {
	if len(refs) == 0 {
		return nil, nil, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(refs))
	for i, r := range refs {
		cmds[i] = pipe.Get(ctx, Own(prefix, r.Queue).Fires(r.Entry))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("read fires counters: %w", err)
	}
	counts, ok = make([]FireCount, len(refs)), make([]bool, len(refs))
	for i, c := range cmds {
		v, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err == nil {
			counts[i], err = parseFireCount(v)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read fires counter of entry %q in queue %q: %w", refs[i].Entry, refs[i].Queue, err)
		}
		ok[i] = true
	}
	return counts, ok, nil
}

func parseFireCount(v string) (FireCount, error) {
	rev, n, _ := strings.Cut(v, " ")
	since, err1 := strconv.ParseUint(rev, 10, 64)
	count, err2 := strconv.Atoi(n)
	if err1 != nil || err2 != nil || count < 0 {
		return FireCount{}, fmt.Errorf("malformed fires counter %q", v)
	}
	return FireCount{Since: since, Count: count}, nil
}

// SeedFireCount raises entry's fires counter in queue's slot to at least c:
// a counter of an earlier revision (or none) is replaced, one of c's
// revision keeps the higher count, one of a later revision stays. It
// returns the counter after the call.
func (s *Store) SeedFireCount(ctx context.Context, prefix, queue, entry string, c FireCount) (FireCount, error) {
	if entry == "" || queue == "" || c.Since == 0 || c.Count < 0 {
		return FireCount{}, fmt.Errorf("seed fires counter of entry %q in queue %q: %w: empty entry or queue, or no revision", entry, queue, ErrInvalidFire)
	}
	v, err := seedFiresScript.Run(ctx, s.client, []string{Own(prefix, queue).Fires(entry)},
		strconv.FormatUint(c.Since, 10), strconv.Itoa(c.Count)).Text()
	if err != nil {
		return FireCount{}, fmt.Errorf("seed fires counter of entry %q in queue %q: %w", entry, queue, err)
	}
	return parseFireCount(v)
}
