package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// HistoryCapture takes the enqueue history of asynq scheduler entries as
// asynq writes it, for the cutover of `cronstream import asynq`: it must
// know the last tick each entry enqueued, and asynq's Scheduler.Shutdown
// deletes every entry's history key (ClearSchedulerHistory) right after
// its last enqueues are recorded.
//
// Each entry's key gets a connection of its own, blocked in BZPOPMAX on
// it. Redis serves a client blocked on a key right after the command (or
// script) that added to it, before any other command, so each event asynq
// records is popped and handed over before anything, a shutdown's DEL
// included, can remove it; nothing depends on polling fast enough. The
// events already in a key are taken first, atomically, so the key is empty
// and the pop blocks. While a capture runs, asynq's history of those
// entries stays empty (`asynq cron history` shows nothing new); Restore
// puts what was taken back.
type HistoryCapture struct {
	mu sync.Mutex
	// taken are the members taken of each entry's key, as asynq wrote
	// them, for Restore.
	taken  map[string][]redis.Z
	events map[string][]SchedulerEnqueueEvent
	bad    []error
	err    error // the first failure of a capture loop

	loops    []*captureLoop
	clients  []*redis.Client // dedicated, closed by Stop
	stopping chan struct{}
	wg       sync.WaitGroup
}

// captureLoop is one entry's blocked connection.
type captureLoop struct {
	entry    string
	key      string
	conn     *redis.Conn
	control  *redis.Client // a client on the same node, to unblock it
	clientID int64
	done     chan struct{}
}

// readyTimeout bounds how long CaptureHistory waits for every connection
// to be blocked in its BZPOPMAX.
const readyTimeout = 10 * time.Second

// CaptureHistory starts capturing the history of the asynq scheduler
// entries named by entryIDs (asynq's entry ids). It returns once every
// entry's connection is blocked on its key, so every event recorded from
// then on is captured. Stop ends it; the caller must call Stop also when
// this returns an error after the first connection was made (it then
// stops what was started).
func (s *Store) CaptureHistory(ctx context.Context, entryIDs []string) (*HistoryCapture, error) {
	c := &HistoryCapture{taken: map[string][]redis.Z{}, events: map[string][]SchedulerEnqueueEvent{}, stopping: make(chan struct{})}
	byNode, err := s.nodesFor(ctx, entryIDs)
	if err != nil {
		return nil, err
	}
	for node, ids := range byNode {
		o := *node.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns = len(ids)+2, 0, 0
		dedicated := redis.NewClient(&o)
		c.clients = append(c.clients, dedicated)
		for _, id := range ids {
			if err := c.start(ctx, dedicated, id); err != nil {
				_ = c.Stop(context.WithoutCancel(ctx))
				return nil, err
			}
		}
	}
	if err := c.waitBlocked(ctx); err != nil {
		_ = c.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// nodesFor groups entry ids by the node that holds their history key:
// one for a single Redis or Sentinel, the key's master on a cluster.
func (s *Store) nodesFor(ctx context.Context, entryIDs []string) (map[*redis.Client][]string, error) {
	out := map[*redis.Client][]string{}
	switch c := s.client.(type) {
	case *redis.Client:
		out[c] = entryIDs
	case *redis.ClusterClient:
		for _, id := range entryIDs {
			node, err := c.MasterForKey(ctx, SchedulerHistoryKey(id))
			if err != nil {
				return nil, fmt.Errorf("find the node of %s: %w", SchedulerHistoryKey(id), err)
			}
			out[node] = append(out[node], id)
		}
	default:
		return nil, fmt.Errorf("capture enqueue history: unsupported Redis client %T", s.client)
	}
	return out, nil
}

// start takes entry's history and blocks a connection of its own on it.
func (c *HistoryCapture) start(ctx context.Context, client *redis.Client, entry string) error {
	key := SchedulerHistoryKey(entry)
	conn := client.Conn()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("capture %s: CLIENT ID: %w", key, err)
	}
	raw, err := takeHistoryScript.Run(ctx, conn, []string{key}).StringSlice()
	if err != nil || len(raw)%2 != 0 {
		_ = conn.Close()
		return fmt.Errorf("capture %s: take the history: %v (%d values)", key, err, len(raw))
	}
	for i := 0; i < len(raw); i += 2 {
		score, err := strconv.ParseFloat(raw[i+1], 64)
		if err != nil {
			_ = conn.Close()
			return fmt.Errorf("capture %s: score %q: %w", key, raw[i+1], err)
		}
		c.add(entry, redis.Z{Member: raw[i], Score: score})
	}
	l := &captureLoop{entry: entry, key: key, conn: conn, control: client, clientID: id, done: make(chan struct{})}
	c.loops = append(c.loops, l)
	c.wg.Add(1)
	go c.run(l)
	return nil
}

// run pops entry's events as asynq records them until Stop unblocks it.
func (c *HistoryCapture) run(l *captureLoop) {
	defer c.wg.Done()
	defer close(l.done)
	for {
		select {
		case <-c.stopping:
			return
		default:
		}
		// No context deadline: the pop blocks until an event comes or Stop
		// unblocks it (CLIENT UNBLOCK, answered like a timeout).
		z, err := l.conn.BZPopMax(context.Background(), 0, l.key).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // unblocked: the loop head sees whether to stop
		case err != nil:
			c.fail(fmt.Errorf("capture %s: %w", l.key, err))
			return
		}
		c.add(l.entry, z.Z)
	}
}

// add keeps one member taken of entry's key.
func (c *HistoryCapture) add(entry string, z redis.Z) {
	member, _ := z.Member.(string)
	ev, err := DecodeSchedulerEnqueueEvent([]byte(member))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.taken[entry] = append(c.taken[entry], redis.Z{Member: member, Score: z.Score})
	if err != nil {
		c.bad = append(c.bad, fmt.Errorf("%s: %w", SchedulerHistoryKey(entry), err))
		return
	}
	c.events[entry] = append(c.events[entry], *ev)
}

func (c *HistoryCapture) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// waitBlocked waits until Redis lists every capture connection as blocked
// (CLIENT LIST ID: flag b), so no event can come before its pop.
func (c *HistoryCapture) waitBlocked(ctx context.Context) error {
	byNode := map[*redis.Client][]any{}
	for _, l := range c.loops {
		byNode[l.control] = append(byNode[l.control], l.clientID)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		blocked := 0
		for node, ids := range byNode {
			info, err := node.Do(ctx, append([]any{"CLIENT", "LIST", "ID"}, ids...)...).Text()
			if err != nil {
				return fmt.Errorf("capture enqueue history: CLIENT LIST: %w", err)
			}
			for _, line := range strings.Split(info, "\n") {
				if blockedFlag(line) {
					blocked++
				}
			}
		}
		if err := c.Err(); err != nil {
			return err
		}
		if blocked == len(c.loops) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("capture enqueue history: %d of %d connections not blocked on their key within %s", len(c.loops)-blocked, len(c.loops), readyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// blockedFlag reports whether a CLIENT LIST line has the blocked flag.
func blockedFlag(info string) bool {
	for _, f := range strings.Fields(info) {
		if v, ok := strings.CutPrefix(f, "flags="); ok {
			return strings.ContainsRune(v, 'b')
		}
	}
	return false
}

// Events returns the events captured so far of each entry (those taken at
// the start and those recorded since), oldest first per entry as taken.
func (c *HistoryCapture) Events() map[string][]SchedulerEnqueueEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]SchedulerEnqueueEvent, len(c.events))
	for k, v := range c.events {
		out[k] = append([]SchedulerEnqueueEvent(nil), v...)
	}
	return out
}

// Undecodable returns the captured members that did not decode.
func (c *HistoryCapture) Undecodable() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.bad...)
}

// Err is the first failure of a capture loop (a lost connection): events
// recorded after it may be missing.
func (c *HistoryCapture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stop unblocks every connection and waits for the loops to end. An event
// popped at that moment is still captured: CLIENT UNBLOCK and a pop exclude
// each other.
func (c *HistoryCapture) Stop(ctx context.Context) error {
	select {
	case <-c.stopping:
	default:
		close(c.stopping)
	}
	var errs []error
	for _, l := range c.loops {
		// A loop between two pops is not blocked, and UNBLOCK does nothing:
		// it sees stopping before it blocks again, or is unblocked next round.
		for done := false; !done; {
			if err := l.control.Do(ctx, "CLIENT", "UNBLOCK", l.clientID).Err(); err != nil {
				errs = append(errs, fmt.Errorf("unblock %s: %w", l.key, err))
				_ = l.conn.Close() // fails the pop instead
			}
			select {
			case <-l.done:
				done = true
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	c.wg.Wait()
	for _, l := range c.loops {
		_ = l.conn.Close()
	}
	for _, cl := range c.clients {
		_ = cl.Close()
	}
	return errors.Join(errs...)
}

// Restore writes the members taken of entries' keys back, as asynq wrote
// them. Call it after Stop, for the entries whose scheduler did not delete
// its history itself (one still running, or one that was killed).
func (s *Store) Restore(ctx context.Context, c *HistoryCapture, entries []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pipe := s.client.Pipeline()
	n := 0
	for _, entry := range entries {
		if zs := c.taken[entry]; len(zs) > 0 {
			pipe.ZAdd(ctx, SchedulerHistoryKey(entry), zs...)
			n += len(zs)
		}
	}
	if n == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("restore %d enqueue events: %w", n, err)
	}
	return nil
}
