// Package keygc deletes the Redis keys of removed entries once they have
// been removed for a grace period: cronstream's watermarks, handover
// markers, fires counters, held ticks and restore proposals in every queue
// slot, and asynq's scheduler history of the entry
// (docs/operations.md "Keys of removed entries").
//
// Each replica runs one Sweeper; with shard ownership only the holder of
// the global duty sweeps (Config.Holds: the owner of the first queue's
// shard 0). The sweep is one duty, not one per queue: its cost is the
// walk of the keyspace, which SCAN makes whatever its MATCH pattern, so a
// walk per queue would multiply it by the number of queues; one walk
// finds every queue's keys and asynq's global history keys at once. A
// sweep two replicas run at once (a duty moving, replicas of an earlier
// build) deletes nothing twice: each delete compares the key with the
// value its scan read. A sweep walks the keyspace with SCAN for
// cronstream's per-entry keys of its tenant prefix, skips entries the
// projection holds, and for each other entry reads the subject's last config
// event (one message from the stream leader). Only an entry whose last event
// is a removal older than the grace loses its keys; an entry that was never
// written on this config stream, or whose last event is bad (quarantined),
// keeps them.
//
// Why a re-registration racing a sweep is safe: the leader read comes after
// the scan, so a registration stored before it is seen and the entry is
// left alone. One stored after it can only lose keys its replicas have not
// written yet: each key is deleted by a script that compares it with the
// value the scan read, so a watermark a new fire moved or a handover marker a
// new revision wrote is kept. A key deleted while still unchanged is a lost
// key, which the scheduler already handles: a fire expecting that watermark
// is refused (mismatch), and the watermark is restored from the activity
// stream before the entry fires again (docs/exactly-once.md, step 9). The
// scheduler history is trimmed only of events enqueued before the removal.
package keygc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// Defaults of Config.
const (
	DefaultGrace    = 24 * time.Hour
	DefaultInterval = 10 * time.Minute
	// DefaultMaxKeys bounds the keys of unregistered entries one sweep
	// reads and deletes; the rest wait for the next sweep.
	DefaultMaxKeys = 10000
)

// Store is the sweeper's seam to Redis; *taskstate.Store implements it.
type Store interface {
	ScanEntryKeys(ctx context.Context, prefix string, want func(entry string) bool, limit int) ([]taskstate.EntryKey, error)
	DeleteRemovedEntryKeys(ctx context.Context, keys []taskstate.EntryKey, removedAt time.Time) (int, error)
}

// Removals tells when an entry was removed; *events.Client implements it.
type Removals interface {
	LastRemoval(ctx context.Context, id string) (events.Removal, bool, error)
}

// Projection is the registered-entry map; *projector.Projector implements it.
type Projection interface {
	Get(id string) (projector.State, bool)
	CaughtUp() bool
}

// Config configures a Sweeper. Zero values mean the defaults.
type Config struct {
	Store      Store
	Removals   Removals
	Projection Projection
	Names      events.Names
	// Grace is how long an entry stays removed before its keys are
	// deleted (default DefaultGrace).
	Grace time.Duration
	// Interval is the mean time between sweeps (default DefaultInterval);
	// each wait is drawn from [Interval/2, 3*Interval/2) so replicas
	// started together do not sweep together. The first sweep comes after
	// one such wait.
	Interval time.Duration
	MaxKeys  int // default DefaultMaxKeys
	// Holds says whether this replica sweeps now (it holds the global
	// duty, ownership.Manager.HoldsGlobal); nil: it always does.
	Holds   func() bool
	Now     func() time.Time // default time.Now
	Logger  *slog.Logger     // default slog.Default()
	Metrics *Metrics         // default NewMetrics(nil)
}

// Sweeper deletes the keys of removed entries, one sweep at a time.
type Sweeper struct {
	cfg  Config
	life lifecycle.Lifecycle
}

// New validates cfg and returns a Sweeper; Start runs it.
func New(cfg Config) (*Sweeper, error) {
	if cfg.Store == nil || cfg.Removals == nil || cfg.Projection == nil {
		return nil, errors.New("keygc: Config.Store, Removals and Projection are required")
	}
	// A negative value is taken as unset too: a negative grace would
	// delete keys at the removal, and a negative interval cannot be waited.
	cfg.Grace = cmp.Or(max(cfg.Grace, 0), DefaultGrace)
	cfg.Interval = cmp.Or(max(cfg.Interval, 0), DefaultInterval)
	cfg.MaxKeys = cmp.Or(max(cfg.MaxKeys, 0), DefaultMaxKeys)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Sweeper{cfg: cfg}, nil
}

// Start runs the sweep loop until Stop and returns at once. Start and Stop
// follow the rules of package lifecycle (a second Start returns
// ErrAlreadyStarted, a Start after Stop ErrStopped).
func (s *Sweeper) Start(ctx context.Context) error {
	if err := s.life.StartLoop(ctx, s.loop); err != nil {
		return fmt.Errorf("keygc: %w", err)
	}
	return nil
}

// Stop ends the loop, cancelling a sweep in flight (deleting a removed
// entry's keys is idempotent: the next sweep, here or on another replica,
// finishes it), and waits for it; ctx is not waited on. It never fails.
func (s *Sweeper) Stop(context.Context) error {
	s.life.Stop()
	return nil
}

func (s *Sweeper) loop(ctx context.Context) {
	t := time.NewTimer(s.wait())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.Sweep(ctx)
		t.Reset(s.wait())
	}
}

func (s *Sweeper) wait() time.Duration {
	return s.cfg.Interval/2 + rand.N(s.cfg.Interval)
}

// Result is what one sweep did.
type Result struct {
	Entries int // removed entries whose keys were deleted
	Keys    int // keys deleted
	Waiting int // removed entries still within the grace
	Errors  int
}

// Sweep runs one sweep now. It does nothing until the projection has caught
// up with the config stream, nor while another replica holds the sweep
// (Config.Holds).
func (s *Sweeper) Sweep(ctx context.Context) Result {
	var res Result
	proj := s.cfg.Projection
	if !proj.CaughtUp() || (s.cfg.Holds != nil && !s.cfg.Holds()) {
		return res
	}
	s.cfg.Metrics.Sweeps.Inc()
	prefix := s.cfg.Names.Prefix()
	keys, err := s.cfg.Store.ScanEntryKeys(ctx, prefix, func(entry string) bool {
		_, registered := proj.Get(entry)
		return !registered
	}, s.cfg.MaxKeys)
	if err != nil {
		s.fail(ctx, &res, "scan for keys of removed entries", err)
		return res
	}
	byEntry := map[string][]taskstate.EntryKey{}
	for _, k := range keys {
		byEntry[k.Entry] = append(byEntry[k.Entry], k)
	}
	ids := make([]string, 0, len(byEntry))
	for id := range byEntry {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		rm, removed, err := s.cfg.Removals.LastRemoval(ctx, id)
		if err != nil {
			s.fail(ctx, &res, "read last config event of entry", err, "entry", id)
			continue
		}
		if !removed {
			continue
		}
		if s.cfg.Now().Sub(rm.Time) < s.cfg.Grace {
			res.Waiting++
			continue
		}
		if _, registered := proj.Get(id); registered {
			continue
		}
		n, err := s.cfg.Store.DeleteRemovedEntryKeys(ctx, byEntry[id], rm.Time)
		res.Keys += n
		s.cfg.Metrics.Deleted.Add(float64(n))
		if err != nil {
			s.fail(ctx, &res, "delete keys of removed entry", err, "entry", id)
			continue
		}
		if n > 0 {
			res.Entries++
		}
	}
	if res.Keys > 0 {
		s.cfg.Logger.Info("deleted Redis keys of removed entries", "entries", res.Entries, "keys", res.Keys, "grace", s.cfg.Grace, "waiting", res.Waiting)
	}
	return res
}

func (s *Sweeper) fail(ctx context.Context, res *Result, msg string, err error, args ...any) {
	if ctx.Err() != nil {
		return // stopping
	}
	res.Errors++
	s.cfg.Metrics.Errors.Inc()
	s.cfg.Logger.Warn(msg, append(args, "err", err)...)
}

// Metrics are the sweeper's Prometheus metrics.
type Metrics struct {
	Deleted prometheus.Counter
	Errors  prometheus.Counter
	Sweeps  prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_removed_entry_keys_deleted_total",
			Help: "Redis keys of removed entries (watermarks, handover markers, asynq scheduler history) deleted after the grace period.",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_removed_entry_key_sweep_errors_total",
			Help: "Failed steps of sweeps for the keys of removed entries (a scan, a config read or a delete); the next sweep tries again.",
		}),
		Sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cronstream_removed_entry_key_sweeps_total",
			Help: "Sweeps for the keys of removed entries this replica ran (with shard ownership only the holder of the global duty sweeps).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Deleted, m.Errors, m.Sweeps)
	}
	return m
}
