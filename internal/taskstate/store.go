package taskstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/redisscript"
)

// Store is cronstream's handle on asynq-compatible task state in one Redis
// deployment (single node, Sentinel or Cluster). It is safe for concurrent
// use and holds no state of its own besides configuration: everything lives
// in Redis, so any number of replicas may use Stores on the same data.
//
// Every script a Store runs touches the keys of one queue only (one cluster
// slot). Scripts are sent with EVALSHA and fall back to EVAL when Redis does
// not know them yet, single or pipelined (internal/redisscript).
type Store struct {
	client redis.UniversalClient
	now    func() time.Time

	recoverChunk int // decisions per RecoverBatch script call
	listPage     int // tasks per LoadLeaseExpired script call
	trimBudget   int // archive members trimmed per script call

	firePath firePath // which fire script paths to use (tests force one)
}

// Option configures a Store.
type Option func(*Store)

// WithClock replaces time.Now as the Store's wall clock (the "now" of asynq
// counters, archive scores and orphan leases). Tests use it; production
// code should not need it.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// WithRecoverChunk sets how many decisions RecoverBatch sends per script
// call. The default keeps every call well under 10 ms of Redis time.
func WithRecoverChunk(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.recoverChunk = n
		}
	}
}

// Defaults sized so that one script call stays well under 10 ms of Redis
// time even on a busy server (figures in docs/benchmarks.md).
const (
	defaultRecoverChunk = 128
	defaultListPage     = 500
	defaultTrimBudget   = 1000
)

// New returns a Store on client.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{
		client:       client,
		now:          time.Now,
		recoverChunk: defaultRecoverChunk,
		listPage:     defaultListPage,
		trimBudget:   defaultTrimBudget,
	}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// Client is the Redis client the Store uses.
func (s *Store) Client() redis.UniversalClient { return s.client }

// ErrInvalidQueue reports a queue name that cannot be used: blank, or (on
// Redis Cluster) starting with '}', which gives an empty hash tag and spreads
// the queue's keys over several slots, breaking every script.
var ErrInvalidQueue = errors.New("invalid queue name")

// CheckQueue validates a queue name for use with this Store.
func (s *Store) CheckQueue(queue string) error {
	if strings.TrimSpace(queue) == "" {
		return fmt.Errorf("%w: %q is blank", ErrInvalidQueue, queue)
	}
	if _, cluster := s.client.(*redis.ClusterClient); cluster && strings.HasPrefix(queue, "}") {
		return fmt.Errorf("%w: %q starts with '}' (empty Redis Cluster hash tag)", ErrInvalidQueue, queue)
	}
	return nil
}

// Queues returns every queue listed in asynq:queues, sorted.
func (s *Store) Queues(ctx context.Context) ([]string, error) {
	qs, err := s.client.SMembers(ctx, AllQueuesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}

// runScript runs script on one queue's keys and returns its array reply.
func runScript(ctx context.Context, c redis.UniversalClient, script *redisscript.Script, keys []string, args ...any) ([]any, error) {
	v, err := script.Run(ctx, c, keys, args...).Result()
	if err != nil {
		return nil, err
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected script reply %T", v)
	}
	return arr, nil
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
