package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/redisscript"
)

// ShardLease is a held shard lease as read from Redis (ownership,
// docs/design.md "Ownership"). Times are Redis TIME.
type ShardLease struct {
	Shard    contract.Shard
	Holder   string
	Acquired time.Time
	Renewed  time.Time
	TTL      time.Duration
}

// Expires is when the lease lapses unless renewed.
func (l ShardLease) Expires() time.Time { return l.Renewed.Add(l.TTL) }

// parseShardLease reads the value of a lease key ("<replica> <acquired ms>
// <renewed ms> <ttl ms>"; the replica id may hold spaces).
func parseShardLease(shard contract.Shard, v string) (ShardLease, bool) {
	f := strings.Fields(v)
	if len(f) < 4 {
		return ShardLease{}, false
	}
	n := make([]int64, 3)
	for i := range n {
		x, err := strconv.ParseInt(f[len(f)-3+i], 10, 64)
		if err != nil || x < 0 {
			return ShardLease{}, false
		}
		n[i] = x
	}
	holder := strings.TrimSuffix(v, " "+strings.Join(f[len(f)-3:], " "))
	if holder == "" || holder == v {
		return ShardLease{}, false
	}
	return ShardLease{Shard: shard, Holder: holder, Acquired: time.UnixMilli(n[0]), Renewed: time.UnixMilli(n[1]),
		TTL: time.Duration(n[2]) * time.Millisecond}, true
}

// ShardLeaseView is one read of the shard leases of some queues.
type ShardLeaseView struct {
	// Now is Redis TIME at the read.
	Now time.Time
	// Leases are the held leases, by queue and index.
	Leases []ShardLease
	// Unreadable holds the queues whose leases could not be read (their
	// slot's node down, say), with the error.
	Unreadable map[string]error
	// Heard is when each replica last heard NATS (NoteNATSHeard), when
	// asked for.
	Heard map[string]time.Time
}

// ShardLeases reads every shard lease of queues in one pipeline: one MGET
// per queue (its leases share the queue's slot), with heard the replicas'
// NATSHeardKey, then Redis TIME. A queue that cannot be read is listed
// in Unreadable; the error is for a read that gave nothing at all.
func (s *Store) ShardLeases(ctx context.Context, prefix string, queues []string, heard bool) (ShardLeaseView, error) {
	pipe := s.client.Pipeline()
	gets := make([]*redis.SliceCmd, len(queues))
	keys := make([]string, contract.ShardsPerQueue)
	for i, q := range queues {
		own := Own(prefix, q)
		for k := range keys {
			keys[k] = own.ShardLease(k)
		}
		gets[i] = pipe.MGet(ctx, keys...)
	}
	var hz *redis.ZSliceCmd
	if heard {
		hz = pipe.ZRangeWithScores(ctx, NATSHeardKey(prefix), 0, -1)
	}
	// TIME after the reads: a lease missing from them expired before Now,
	// so one seen last poll and gone with term left was released (read
	// first, a lease that expired between TIME and the MGET looked
	// released).
	tm := pipe.Time(ctx)
	_, _ = pipe.Exec(ctx)
	now, err := tm.Result()
	if err != nil {
		return ShardLeaseView{}, fmt.Errorf("read shard leases: redis TIME: %w", err)
	}
	v := ShardLeaseView{Now: now}
	for i, q := range queues {
		vals, err := gets[i].Result()
		if err != nil {
			if v.Unreadable == nil {
				v.Unreadable = map[string]error{}
			}
			v.Unreadable[q] = fmt.Errorf("read shard leases of queue %q: %w", q, err)
			continue
		}
		for k, x := range vals {
			str, ok := x.(string)
			if !ok {
				continue
			}
			if l, ok := parseShardLease(contract.Shard{Queue: q, Index: k}, str); ok {
				v.Leases = append(v.Leases, l)
			}
		}
	}
	if hz != nil {
		zs, err := hz.Result()
		if err != nil {
			return v, fmt.Errorf("read when replicas last heard NATS: %w", err)
		}
		v.Heard = make(map[string]time.Time, len(zs))
		for _, z := range zs {
			if id, ok := z.Member.(string); ok {
				v.Heard[id] = time.UnixMilli(int64(z.Score))
			}
		}
	}
	return v, nil
}

// LeaseResult is what an acquire, renewal or release did to one shard's
// lease.
type LeaseResult struct {
	// Held: the owner holds the lease now (acquire, renew), or released
	// it (release).
	Held bool
	// Now is Redis TIME at the call (acquire and renew).
	Now time.Time
	// Err is the error of the call for the shard's queue.
	Err error
}

// AcquireShardLeases takes each free lease of shards for owner for ttl, or
// renews those it holds already: one script call per queue, pipelined.
func (s *Store) AcquireShardLeases(ctx context.Context, prefix, owner string, ttl time.Duration, shards []contract.Shard) ([]LeaseResult, error) {
	return s.leaseCalls(ctx, acquireShardLeaseScript, "acquire", prefix, owner, ttl, shards)
}

// RenewShardLeases renews each lease of shards that owner holds, and takes
// again one that is free (lapsed, or lost with Redis's data); a lease
// another replica took is reported not held.
func (s *Store) RenewShardLeases(ctx context.Context, prefix, owner string, ttl time.Duration, shards []contract.Shard) ([]LeaseResult, error) {
	return s.leaseCalls(ctx, renewShardLeaseScript, "renew", prefix, owner, ttl, shards)
}

// ReleaseShardLeases deletes each lease of shards that owner holds.
func (s *Store) ReleaseShardLeases(ctx context.Context, prefix, owner string, shards []contract.Shard) ([]LeaseResult, error) {
	return s.leaseCalls(ctx, releaseShardLeaseScript, "release", prefix, owner, 0, shards)
}

// leaseCalls runs script once per queue of shards, all in one pipeline,
// and returns each shard's result in shards' order.
func (s *Store) leaseCalls(ctx context.Context, script *redisscript.Script, what, prefix, owner string, ttl time.Duration, shards []contract.Shard) ([]LeaseResult, error) {
	if owner == "" {
		return nil, fmt.Errorf("%s shard leases: empty owner", what)
	}
	if script != releaseShardLeaseScript && ttl < time.Millisecond {
		return nil, fmt.Errorf("%s shard leases: ttl %s below 1ms", what, ttl)
	}
	type call struct {
		at  []int // positions in shards
		cmd *redis.Cmd
	}
	byQueue := map[string]*call{}
	var order []string
	keys := map[string][]string{}
	for i, sh := range shards {
		c := byQueue[sh.Queue]
		if c == nil {
			c = &call{}
			byQueue[sh.Queue] = c
			order = append(order, sh.Queue)
		}
		c.at = append(c.at, i)
		keys[sh.Queue] = append(keys[sh.Queue], Own(prefix, sh.Queue).ShardLease(sh.Index))
	}
	b := redisscript.NewBatch(s.client)
	for _, q := range order {
		if script == releaseShardLeaseScript {
			byQueue[q].cmd = b.Run(ctx, script, keys[q], owner)
		} else {
			byQueue[q].cmd = b.Run(ctx, script, keys[q], owner, ttl.Milliseconds())
		}
	}
	b.Exec(ctx)
	out := make([]LeaseResult, len(shards))
	var errs []error
	for _, q := range order {
		c := byQueue[q]
		held, now, err := leaseReply(c.cmd, script == releaseShardLeaseScript, len(c.at))
		if err != nil {
			err = fmt.Errorf("%s shard leases of queue %q for %q: %w", what, q, owner, err)
			errs = append(errs, err)
		}
		for j, i := range c.at {
			out[i] = LeaseResult{Now: now, Err: err}
			if err == nil {
				out[i].Held = held[j]
			}
		}
	}
	if len(errs) == len(order) && len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	return out, nil
}

// leaseReply decodes a lease script's reply: Redis TIME first unless
// noTime, then one 0/1 per key.
func leaseReply(cmd *redis.Cmd, noTime bool, n int) ([]bool, time.Time, error) {
	vals, err := cmd.Int64Slice()
	if err != nil {
		return nil, time.Time{}, err
	}
	var now time.Time
	if !noTime {
		if len(vals) == 0 {
			return nil, time.Time{}, fmt.Errorf("empty reply")
		}
		now, vals = time.UnixMilli(vals[0]), vals[1:]
	}
	if len(vals) != n {
		return nil, time.Time{}, fmt.Errorf("%d results for %d leases", len(vals), n)
	}
	held := make([]bool, n)
	for i, v := range vals {
		held[i] = v == 1
	}
	return held, now, nil
}

// NoteNATSHeard records that replica last heard NATS at at (the
// Redis-corrected clock), and forgets replicas not heard of for a day.
func (s *Store) NoteNATSHeard(ctx context.Context, prefix, replica string, at time.Time) error {
	pipe := s.client.Pipeline()
	key := NATSHeardKey(prefix)
	pipe.ZAdd(ctx, key, redis.Z{Score: float64(at.UnixMilli()), Member: replica})
	pipe.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(at.Add(-24*time.Hour).UnixMilli(), 10))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("note that %q heard NATS: %w", replica, err)
	}
	return nil
}
