package replica

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/keygc"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// Config configures one replica. Zero values mean the defaults.
type Config struct {
	// NATSURL is one or more comma-separated server URLs; NATSOptions add
	// credentials and TLS.
	NATSURL     string
	NATSOptions []nats.Option
	// Redis is the asynq Redis (single, Sentinel or Cluster client).
	Redis redis.UniversalClient

	Names     events.Names
	ReplicaID string // default host-pid-random
	Version   string
	Revision  string // VCS revision of the build, for cronstream_build_info

	// Streams: replicas of the streams and bucket (1 dev, 3 production),
	// the activity stream's retention and duplicate window.
	StreamReplicas  int
	ActivityMaxAge  time.Duration
	DuplicateWindow time.Duration

	// Scheduler.
	MaxStaleness time.Duration
	Grace        time.Duration
	// LateAfter: an entry whose tick is overdue for longer is late (the
	// stall detector; default stall.DefaultLateAfter).
	LateAfter time.Duration
	// MetricsPerEntry exports each entry's last and next fire time from
	// the replica that owns its shard (scheduler.Collector).
	MetricsPerEntry bool
	// ClockOffset shifts this replica's local clock. For tests only: it
	// simulates a host whose clock is off; the replica's clock corrects
	// it against Redis TIME like any drift.
	ClockOffset time.Duration
	// FreezeViewFile, for tests only: while this file exists, the
	// replica's view of the other replicas is frozen (a split view, the
	// chaos suite's fault).
	FreezeViewFile string

	// MaxOutboxBytes: firing pauses while the outbox backlog takes more
	// Redis memory than this (default DefaultMaxOutboxBytes).
	MaxOutboxBytes int64
	// RedisWaitReplicas and RedisWaitTimeout: the relay publishes a batch
	// of events once this many Redis replicas hold its writes (0: none;
	// relay.WaitAuto) or the timeout passed (relay.Config.WaitReplicas).
	RedisWaitReplicas int
	RedisWaitTimeout  time.Duration

	// Recoverer: queues (empty: every queue in asynq:queues), interval and
	// grace.
	Queues          []string
	RecoverInterval time.Duration
	RecoverGrace    time.Duration

	// RemovedKeyGrace: the Redis keys of an entry removed this long ago are
	// deleted (keygc; default keygc.DefaultGrace). KeySweepInterval is the
	// mean time between those sweeps (default keygc.DefaultInterval).
	RemovedKeyGrace  time.Duration
	KeySweepInterval time.Duration

	// HTTPAddr serves /healthz, /readyz and /metrics ("" : no HTTP).
	HTTPAddr string
	// Console, when set, serves the read-only web console at / on
	// HTTPAddr.
	Console *console.Config
	// Heartbeat is how often the replica refreshes its heartbeat and its
	// clock offset to Redis.
	Heartbeat time.Duration
	// UnresponsiveFor is how long the replicas bucket keeps the heartbeat
	// of a replica that stopped beating (default DefaultUnresponsiveFor);
	// it applies to a bucket this replica creates.
	UnresponsiveFor time.Duration
	// ShutdownTimeout bounds the drain at stop (default 15s).
	ShutdownTimeout time.Duration

	// SkipRedisChecks skips the warnings about Redis's eviction policy and
	// persistence (dev mode's in-process server has no CONFIG and keeps
	// nothing anyway, which dev already says).
	SkipRedisChecks bool

	Logger *slog.Logger
	// Ready, when set, receives the HTTP address once the replica serves.
	Ready func(httpAddr string)
}

// DefaultMaxOutboxBytes bounds the outbox backlog a NATS outage leaves in
// Redis: at taskstate.OutboxRecordBytes per record it holds 35 minutes of
// 1,000 fires per second, so firing rides out a NATS outage of half an hour
// at that rate (docs/operations.md, "NATS outages").
const DefaultMaxOutboxBytes = 512 << 20

// DefaultShutdownTimeout bounds the drain after SIGTERM; an orchestrator's
// grace period must cover it (deploy/kubernetes).
const DefaultShutdownTimeout = 15 * time.Second

// DefaultReplicaID is host-pid-random: unique per process, readable in
// status and in the audit log.
func DefaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Replica is one running cronstream replica.
type Replica struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry

	nc    *nats.Conn
	js    jetstream.JetStream
	store *taskstate.Store
	clock *scheduler.Clock

	proj    *projector.Projector
	members *Membership
	relay   *relay.Relay
	sched   *scheduler.Scheduler
	recov   *recoverer.Recoverer
	stall   *stall.Detector
	keygc   *keygc.Sweeper
	own     *ownership.Manager
	// owner, firing and relayed are own, sched and relay for the
	// heartbeat, which starts before they are made.
	owner   atomic.Pointer[ownership.Manager]
	firing  atomic.Pointer[scheduler.Scheduler]
	relayed atomic.Pointer[relay.Relay]
	http    *httpServer
	auth    *authWatch
	console *console.Console

	// failPause pauses entries with pause_on_failure whose tasks are archived.
	failPause *failpause.Watcher
	// routes watches the streams for ways other than a publish to write
	// them.
	routes routeWatch

	mu      sync.Mutex
	started bool
	// startBlocked is the last error a start step is retrying ("" when
	// none), for readiness while starting.
	startBlocked string
}

// Run runs a replica until ctx ends, then stops it cleanly: firing stops
// after the batch in flight, the outbox is flushed, the heartbeat removed.
// It keeps trying to reach NATS and Redis while they are unavailable (not
// ready meanwhile) and returns an error only for bad configuration.
func Run(ctx context.Context, cfg Config) error {
	r, err := newReplica(cfg)
	if err != nil {
		return err
	}
	return r.run(ctx)
}

func newReplica(cfg Config) (*Replica, error) {
	if cfg.Redis == nil {
		return nil, errors.New("replica: a Redis client is required")
	}
	cfg.NATSURL = cmp.Or(cfg.NATSURL, nats.DefaultURL)
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = DefaultReplicaID() // random: only when unset
	}
	// Its heartbeat could never be written: refuse it now rather than
	// retry the start.
	if err := events.ValidateReplicaID(cfg.ReplicaID); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	// A negative value is taken as unset too, as it always was.
	cfg.Heartbeat = cmp.Or(max(cfg.Heartbeat, 0), DefaultHeartbeat)
	cfg.ShutdownTimeout = cmp.Or(max(cfg.ShutdownTimeout, 0), DefaultShutdownTimeout)
	cfg.MaxOutboxBytes = cmp.Or(max(cfg.MaxOutboxBytes, 0), DefaultMaxOutboxBytes)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.Logger = cfg.Logger.With("replica", cfg.ReplicaID)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoGauge(cfg.Version, cfg.Revision))
	return &Replica{cfg: cfg, log: cfg.Logger, reg: reg, auth: newAuthWatch(reg, cfg.Logger)}, nil
}

func (r *Replica) run(ctx context.Context) error {
	if r.cfg.HTTPAddr != "" {
		h, err := newHTTPServer(r.cfg.HTTPAddr, r.reg, r.log)
		if err != nil {
			return err
		}
		r.http = h
		if r.cfg.Console != nil {
			if err := r.mountConsole(h); err != nil {
				return err
			}
		}
		h.addCheck("starting", func(context.Context) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if !r.started {
				// Nothing fires before the projection is loaded: say so,
				// and what the start is waiting for.
				msg := "replica is starting: no projection of the config stream yet, nothing fires"
				if r.startBlocked != "" {
					msg += " (retrying " + r.startBlocked + ")"
				}
				return errors.New(msg)
			}
			return nil
		})
		h.start()
		r.log.Info("serving http", "addr", h.Addr())
	}
	if err := r.start(ctx); err != nil {
		r.shutdown()
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	r.mu.Lock()
	r.started = true
	r.mu.Unlock()
	r.auth.armed.Store(true)
	r.attachConsole()
	r.log.Info("replica running", "prefix", r.cfg.Names.Prefix(), "entries", r.proj.Len())
	if r.cfg.Ready != nil {
		addr := ""
		if r.http != nil {
			addr = r.http.Addr()
		}
		r.cfg.Ready(addr)
	}
	r.heartbeat(ctx)
	r.log.Info("stopping")
	r.shutdown()
	r.log.Info("stopped")
	return nil
}

// holdsQueue reports whether this replica holds queue's duties (none
// before its ownership runs).
func (r *Replica) holdsQueue(queue string) bool {
	own := r.owner.Load()
	return own != nil && own.HoldsQueue(queue)
}

// viewFrozen reports whether FreezeViewFile exists (tests only).
func (r *Replica) viewFrozen() bool {
	if r.cfg.FreezeViewFile == "" {
		return false
	}
	_, err := os.Stat(r.cfg.FreezeViewFile)
	return err == nil
}

// readyToOwn reports whether this replica may own shards: its projection
// is caught up, and its fires are not all refused by the fences (it fires
// from a configuration the slots outgrew).
func (r *Replica) readyToOwn() bool {
	s := r.firing.Load()
	return r.proj.CaughtUp() && (s == nil || s.Fenced() < ownership.FencedFor)
}

// heardNATS is when this replica last heard NATS, on the Redis-corrected
// clock: its last heartbeat stored, or the projection's last message or
// consumer heartbeat, whichever is later.
func (r *Replica) heardNATS() time.Time {
	beat, proj := r.members.LastBeat(), r.proj.LastHeard()
	if proj.After(beat) {
		return proj
	}
	return beat
}

func (r *Replica) lateAfter() time.Duration {
	if r.cfg.LateAfter > 0 {
		return r.cfg.LateAfter
	}
	return stall.DefaultLateAfter
}

// registerProjectionMetrics exports the projection's counters.
func (r *Replica) registerProjectionMetrics() {
	proj := r.proj
	r.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cronstream_config_stream_reloads_total",
		Help: "Projections reloaded because the config stream was recreated or restored under a running replica.",
	}, func() float64 { return float64(proj.Stats().Reloads) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cronstream_quarantined_entries",
		Help: "Entries whose last config event cannot be applied (undecodable, unknown type, invalid): they fire nothing until a valid event arrives; status names them.",
	}, func() float64 { return float64(proj.Stats().Quarantined) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cronstream_config_bad_events_total",
		Help: "Config events this replica could not apply since it started (each quarantined its entry, or was ignored on a subject that names none).",
	}, func() float64 { st := proj.Stats(); return float64(st.Bad + st.Ignored) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cronstream_config_refused_total",
		Help: "Messages on entries' config or fail-pause subjects the projection refused (fail-pause requests that do not hold, messages a NATS server wrote there); each is logged.",
	}, func() float64 { return float64(proj.Stats().RefusedLive) }))
}

// maxReportedLate bounds the late entries a replica reports in its
// heartbeat (status merges their reasons).
const maxReportedLate = 32

func (r *Replica) unresponsiveFor() time.Duration {
	return cmp.Or(max(r.cfg.UnresponsiveFor, 0), DefaultUnresponsiveFor)
}

func (r *Replica) maxStaleness() time.Duration {
	if r.cfg.MaxStaleness > 0 {
		return r.cfg.MaxStaleness
	}
	return scheduler.DefaultMaxStaleness
}

func (r *Replica) httpAddr() string {
	if r.http == nil {
		return ""
	}
	return r.http.Addr()
}

// heartbeat measures the clock offset to Redis on every beat until ctx
// ends (the membership beats on its own).
func (r *Replica) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	var catchup catchupWarner
	catchup.check(ctx, r.js, r.cfg.Names, r.proj, r.log)
	r.routes.check(ctx, r.js, r.cfg.Names, r.log)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, r.cfg.Heartbeat)
			if err := r.clock.Sync(sctx); err != nil && ctx.Err() == nil {
				r.log.Warn("measure clock offset to Redis", "err", err)
			}
			cancel()
			catchup.check(ctx, r.js, r.cfg.Names, r.proj, r.log)
			r.routes.check(ctx, r.js, r.cfg.Names, r.log)
		}
	}
}

// warnRedisConfig says plainly when Redis may lose acknowledged writes:
// exactly-once firing and asynq itself depend on it.
func (r *Replica) warnRedisConfig(ctx context.Context) {
	if r.cfg.SkipRedisChecks {
		return
	}
	for _, w := range RedisWarnings(ctx, r.cfg.Redis) {
		r.log.Warn(w)
	}
}

// beatUpdate refreshes the dynamic fields of this replica's heartbeat:
// its config position, its late entries, its relay's view of Redis
// replication once the relay exists, and the capacity it has shown.
func (r *Replica) beatUpdate(streamWarnings []string) func(*Info) {
	det := r.stall
	return func(i *Info) {
		i.ConfigSeq = r.proj.LastSeq()
		i.Late = det.Late(maxReportedLate)
		i.Warnings = append(slices.Clip(streamWarnings), r.routes.warnings()...)
		if rl := r.relayed.Load(); rl != nil {
			w := rl.WaitStatus()
			i.RedisWait = &w
		}
		i.Shards, i.Ready = true, r.readyToOwn()
		if own := r.owner.Load(); own != nil {
			rep := own.Report()
			i.Ownership = &rep
		}
		i.FireCapacity = 0
		if s := r.firing.Load(); s != nil {
			if c, ok := s.Capacity(); ok {
				i.FireCapacity = c.PerSecond
			}
		}
	}
}

// RedisWarnings returns what is unsafe in Redis's configuration for asynq
// and exactly-once firing: an eviction policy other than noeviction, or no
// persistence. CONFIG may be disabled (managed Redis); then it says so.
func RedisWarnings(ctx context.Context, c redis.UniversalClient) []string {
	var out []string
	cfg, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return []string{fmt.Sprintf("cannot read Redis configuration (%v): make sure maxmemory-policy is noeviction and persistence is on", err)}
	}
	if p := cfg["maxmemory-policy"]; p != "" && p != "noeviction" {
		out = append(out, fmt.Sprintf("Redis maxmemory-policy is %q: Redis may evict task and watermark keys; asynq and exactly-once firing need noeviction", p))
	}
	aof, err1 := c.ConfigGet(ctx, "appendonly").Result()
	save, err2 := c.ConfigGet(ctx, "save").Result()
	if err1 == nil && err2 == nil && aof["appendonly"] != "yes" && save["save"] == "" {
		out = append(out, "Redis persistence is off (no AOF, no RDB snapshots): a Redis restart loses tasks and watermarks, and ticks may fire twice")
	}
	return out
}

func (r *Replica) shutdown() {
	r.auth.armed.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer cancel()
	// Each Stop ends its component's background work; ctx bounds the
	// drains (the recoverer's batch, the relay's flush, the heartbeat's
	// removal). Nothing is left running whatever they return.
	if r.sched != nil {
		_ = r.sched.Stop(ctx) // nothing to drain: never fails
	}
	// No fire in flight. The recoverer finishes its batch and the relay
	// publishes what the last fires and recoveries wrote while this
	// replica still holds its queues' duties: released first, those
	// outboxes would wait for another replica, and in a deployment of one
	// for the next start. Then the shards go to their next owners at
	// once, and the heartbeat with them, so the others stop counting this
	// replica in (and take the shards as their desired owners) without
	// waiting for it to expire.
	if r.recov != nil {
		if err := r.recov.Stop(ctx); err != nil {
			r.log.Warn("recovery batch cut short; the next pass, here or on another replica, redoes it", "err", err)
		}
	}
	if r.relay != nil {
		if err := r.relay.Stop(ctx); err != nil {
			r.log.Warn("outbox not fully flushed; another replica will publish the rest", "err", err)
		}
	}
	if r.own != nil {
		if err := r.own.Stop(ctx); err != nil {
			r.log.Warn("release shard leases; they lapse on their own", "err", err)
		}
	}
	if r.members != nil {
		if err := r.members.Stop(ctx); err != nil {
			r.log.Warn("remove heartbeat", "err", err)
		}
	}
	if r.stall != nil {
		_ = r.stall.Stop(ctx) // nothing to drain: never fails
	}
	if r.keygc != nil {
		_ = r.keygc.Stop(ctx) // a sweep in flight is cancelled: never fails
	}
	if r.failPause != nil {
		_ = r.failPause.Stop(ctx) // a scan in flight is cancelled: never fails
	}
	if r.proj != nil {
		_ = r.proj.Stop(ctx) // nothing to drain: never fails
	}
	if r.http != nil {
		r.http.stop(ctx)
	}
	if r.nc != nil {
		_ = r.nc.Drain()
	}
}
