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

// Confirmed outbox reads (docs/exactly-once.md, step 8). A fire's event may be published only once its write is
// on the Redis replicas a failover could promote, or a failover that loses
// the write leaves an event describing a task that no longer exists.
//
// Redis's WAIT blocks until the replicas have acknowledged the replication
// offset of the calling connection's last write: the master's offset right
// after that write was propagated. The fire scripts write on other
// connections (other replicas' too), so WAIT is not called after them.
// Instead ReadOutboxConfirmed sends, on one connection to the master that
// holds the outbox's slot, in this order: the XRANGE that reads the
// records, a write of its own (the renewal of the relay's outbox lease,
// which always writes: PEXPIRE of its lease, or SET of a new one), and
// WAIT. The argument for why that covers every record read:
//
//   - Redis appends a command's (or a script's) effects to the replication
//     stream when the command ends, before it runs the next command of any
//     client. So a record the XRANGE returns was written by a script whose
//     effects, task and watermark with it, are already in the stream: at
//     offsets below the master's offset at the time of the read.
//   - The lease renewal runs after the read on the same connection, so its
//     effects come later in that one stream: the connection's offset is
//     above every record read.
//   - The stream is one ordered log; a replica acknowledges how far into it
//     it has applied. A replica that acknowledged the renewal's offset has
//     applied everything before it: every record read, with its task and
//     watermark.
//
// A renewal that writes nothing would leave the connection's offset where
// an older write put it (or at none), and WAIT would confirm too little;
// the lease script writes whenever it reports the lease held, and a read
// without the lease is not published. A renewal refused with NOSCRIPT is
// run again on the same connection (EVAL), after the read as well.

// OutboxRead is what ReadOutboxConfirmed read and learned.
type OutboxRead struct {
	// Records are the records read, in order; empty when Owned is false.
	Records []OutboxRecord
	// Owned: the relay holds the outbox's lease (renewed by the read).
	Owned bool
	// Acked is how many replicas acknowledged every write up to the
	// read's (WAIT's reply), when it waited.
	Acked int
}

// ErrWaitRefused reports a Redis that refuses WAIT (an ACL without it, a
// proxy that does not forward it, a server that is itself a replica).
var ErrWaitRefused = errors.New("Redis refuses WAIT")

// ErrWaitUnsupported reports a Redis client whose connections cannot be
// held for a WAIT (neither a single-node, Sentinel nor Cluster client).
var ErrWaitUnsupported = errors.New("WAIT not supported with this Redis client")

// ReadOutboxConfirmed reads up to count records of queue's outbox after
// stream id after ("" = from the first), renews owner's lease on it for
// ttl, and, when replicas > 0 and the lease is held, waits at most timeout
// until that many Redis replicas acknowledged every write made before the
// read (see above). A WAIT Redis refuses returns the read with an error
// wrapping ErrWaitRefused.
func (s *Store) ReadOutboxConfirmed(ctx context.Context, prefix, queue, owner string, ttl time.Duration, after string, count, replicas int, timeout time.Duration) (OutboxRead, error) {
	if owner == "" || ttl < time.Millisecond || count <= 0 {
		return OutboxRead{}, fmt.Errorf("confirmed read of outbox of queue %q: empty owner, ttl below 1ms or no count", queue)
	}
	own := Own(prefix, queue)
	master, err := s.slotMaster(ctx, own.Outbox())
	if errors.Is(err, ErrWaitUnsupported) {
		return s.readOutboxUnconfirmed(ctx, prefix, queue, owner, ttl, after, count, err)
	}
	if err != nil {
		return OutboxRead{}, fmt.Errorf("confirmed read of outbox of queue %q: %w", queue, err)
	}
	conn := master.Conn()
	defer conn.Close()
	var read *redis.Cmd
	renew := acquireOutboxScript.Cmd(ctx, []string{own.OutboxOwner()}, owner, ttl.Milliseconds())
	_, _ = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		read = p.Do(ctx, "xrange", own.Outbox(), outboxStart(after), "+", "count", count)
		return p.Process(ctx, renew)
	})
	reply, err := read.Slice()
	if err != nil {
		return OutboxRead{}, fmt.Errorf("read outbox of queue %q: %w", queue, err)
	}
	if isNoScript(renew.Err()) {
		// Not run: run it now, on this connection, still after the read.
		renew = acquireOutboxScript.Run(ctx, conn, []string{own.OutboxOwner()}, owner, ttl.Milliseconds())
	}
	held, err := renew.Int64()
	if err != nil {
		return OutboxRead{}, fmt.Errorf("renew the outbox lease of queue %q for %q: %w", queue, owner, err)
	}
	if held != 1 {
		return OutboxRead{}, nil
	}
	recs, err := outboxRecords(queue, reply)
	if err != nil {
		return OutboxRead{}, err
	}
	out := OutboxRead{Records: recs, Owned: true}
	if replicas <= 0 || len(recs) == 0 {
		return out, nil
	}
	// WAIT 0 ms would block for ever.
	n, err := conn.Wait(ctx, replicas, max(timeout, time.Millisecond)).Result()
	switch {
	case err == nil:
		out.Acked = int(n)
	case isRefusal(err):
		return out, fmt.Errorf("WAIT %d replicas on the master of queue %q: %w: %w", replicas, queue, ErrWaitRefused, err)
	default:
		return OutboxRead{}, fmt.Errorf("WAIT %d replicas on the master of queue %q: %w", replicas, queue, err)
	}
	return out, nil
}

// readOutboxUnconfirmed is ReadOutboxConfirmed without the WAIT, for a
// client whose connections cannot be held (why): the read, and the error
// that says it is unconfirmed (ErrWaitRefused).
func (s *Store) readOutboxUnconfirmed(ctx context.Context, prefix, queue, owner string, ttl time.Duration, after string, count int, why error) (OutboxRead, error) {
	held, err := s.AcquireOutbox(ctx, prefix, queue, owner, ttl)
	if err != nil || !held {
		return OutboxRead{}, err
	}
	recs, err := s.ReadOutbox(ctx, prefix, queue, after, count)
	if err != nil {
		return OutboxRead{}, err
	}
	return OutboxRead{Records: recs, Owned: true}, fmt.Errorf("outbox of queue %q: %w: %w", queue, ErrWaitRefused, why)
}

// isNoScript: Redis did not know the script and did not run it.
func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// isRefusal: Redis refused the command itself (it did not fail to run it).
func isRefusal(err error) bool {
	if redis.HasErrorPrefix(err, "NOPERM") {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "replica")
}

// slotMaster is the client of the node that holds key's slot: the client
// itself on a single node or behind Sentinel, the slot's master on a
// Cluster.
func (s *Store) slotMaster(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.client.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("find the master of key %q: %w", key, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%w (%T)", ErrWaitUnsupported, s.client)
}

// OutboxMaster names the Redis node that holds queue's outbox: its
// address on a Cluster, "" otherwise (every queue is on the one master).
func (s *Store) OutboxMaster(ctx context.Context, prefix, queue string) (string, error) {
	if _, cluster := s.client.(*redis.ClusterClient); !cluster {
		return "", nil
	}
	m, err := s.slotMaster(ctx, Own(prefix, queue).Outbox())
	if err != nil {
		return "", err
	}
	return m.Options().Addr, nil
}

// Replication is what a master says of its replicas (INFO replication).
type Replication struct {
	// Role is "master", or "slave" for a server that is itself a replica.
	Role string
	// Connected is the replicas connected to it; Online those of them
	// past their initial synchronisation, acknowledging as they apply.
	Connected, Online int
}

// ErrInfoRefused reports a Redis that refuses INFO.
var ErrInfoRefused = errors.New("Redis refuses INFO")

// OutboxReplication reads INFO replication on the master that holds
// queue's outbox.
func (s *Store) OutboxReplication(ctx context.Context, prefix, queue string) (Replication, error) {
	master, err := s.slotMaster(ctx, Own(prefix, queue).Outbox())
	if err != nil {
		return Replication{}, err
	}
	info, err := master.Info(ctx, "replication").Result()
	if err != nil {
		if isRefusal(err) {
			return Replication{}, fmt.Errorf("INFO replication on the master of queue %q: %w: %w", queue, ErrInfoRefused, err)
		}
		return Replication{}, fmt.Errorf("INFO replication on the master of queue %q: %w", queue, err)
	}
	return parseReplication(info), nil
}

// parseReplication reads INFO replication's role, connected_slaves and
// the state of each slave<N> line.
func parseReplication(info string) Replication {
	var r Replication
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "role":
			r.Role = v
		case k == "connected_slaves":
			r.Connected, _ = strconv.Atoi(v)
		case strings.HasPrefix(k, "slave") && strings.Contains(","+v+",", ",state=online,"):
			r.Online++
		}
	}
	return r
}

// outboxStart is XRANGE's start for records after stream id after.
func outboxStart(after string) string {
	if after == "" {
		return "-"
	}
	return "(" + after
}
