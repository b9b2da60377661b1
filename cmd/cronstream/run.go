package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/keygc"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
)

func init() { subcommands = append(subcommands, newRunCommand) }

// replicaFlags are the flags of a replica, shared by run and dev.
type replicaFlags struct {
	conn            connFlags
	replicaID       string
	replicas        int
	activityMaxAge  time.Duration
	queues          []string
	recoverInterval time.Duration
	recoverGrace    time.Duration
	removedKeyGrace time.Duration
	maxStaleness    time.Duration
	maxOutboxBytes  byteSize
	maxOutbox       int64 // deprecated: a record count
	lateAfter       time.Duration
	// redisWaitReplicas is "auto" or a count (relay.Config.WaitReplicas).
	redisWaitReplicas string
	redisWaitTimeout  time.Duration
	metricsPerEntry   bool
	clockOffset       time.Duration
	freezeView        string
	http              string
	consoleDefault    bool // dev serves the console unless --console=false
	console           bool
	consolePayloads   bool
	httpToken         string
	logFormat         string
	logLevel          string
}

func (f *replicaFlags) add(cmd *cobra.Command, httpDefault string) {
	fl := cmd.Flags()
	fl.StringVar(&f.replicaID, "replica-id", "", "this replica's id (default host-pid-random)")
	fl.IntVar(&f.replicas, "replicas", 1, "stream replicas when creating missing streams: 1 for development, 3 for production (R3); existing streams are changed only by \"cronstream streams apply\"")
	fl.DurationVar(&f.activityMaxAge, "activity-max-age", events.DefaultActivityMaxAge, "how long the activity stream keeps fire and recovery events, when creating it (\"cronstream streams apply\" changes it)")
	fl.StringSliceVar(&f.queues, "queues", nil, "queues to recover (default: every queue in asynq:queues)")
	fl.DurationVar(&f.recoverInterval, "recover-interval", 5*time.Second, "how often the recoverer looks for lease-expired tasks")
	fl.DurationVar(&f.recoverGrace, "recover-grace", 20*time.Second, "recover a task once its lease has been expired this long (asynq's own recoverer uses 30s)")
	fl.DurationVar(&f.removedKeyGrace, "removed-key-grace", keygc.DefaultGrace, "delete the Redis keys of an entry (watermarks, handover markers, asynq scheduler history) once it has been removed this long")
	fl.DurationVar(&f.maxStaleness, "max-staleness", 30*time.Second, "stop firing when this replica has not heard the config stream for this long while others have")
	f.maxOutboxBytes.n = replica.DefaultMaxOutboxBytes
	fl.Var(&f.maxOutboxBytes, "max-outbox-bytes", "pause firing while the outbox records waiting for NATS take more Redis memory than this (bytes, or with KiB, MiB, GiB)")
	fl.Int64Var(&f.maxOutbox, "max-outbox", 0, "deprecated: use --max-outbox-bytes")
	_ = fl.MarkDeprecated("max-outbox", fmt.Sprintf("use --max-outbox-bytes; a record count is taken as that many records of %d bytes", taskstate.OutboxRecordBytes))
	fl.StringVar(&f.redisWaitReplicas, "redis-wait-replicas", "auto", "publish an event only once this many Redis replicas hold its write (Redis WAIT): a number, 0 for none, or auto: 1 on a Redis that has or had a replica since the start, none on one that never had")
	fl.DurationVar(&f.redisWaitTimeout, "redis-wait-timeout", relay.DefaultWaitTimeout, "longest wait for --redis-wait-replicas; a batch not confirmed in time is published marked unconfirmed (at most "+maxWaitTimeout.String()+")")
	fl.DurationVar(&f.lateAfter, "late-after", stall.DefaultLateAfter, "an entry whose tick is overdue (due time plus jitter) for longer is late: metrics, a warning, status, and /readyz when this replica's own fires all fail")
	fl.BoolVar(&f.metricsPerEntry, "metrics-per-entry", false, "export each entry's last and next fire time (cronstream_entry_*_fire_timestamp_seconds), only from the replica that owns the entry's shard: one series pair per entry across the replicas")
	fl.DurationVar(&f.clockOffset, "test-clock-offset", 0, "TEST ONLY: run this replica's local clock this far off (e.g. 1h, -1h) to test clock skew; the replica corrects it against Redis TIME. Never set it in production")
	fl.StringVar(&f.freezeView, "test-freeze-view", "", "TEST ONLY: while this file exists, freeze this replica's view of the other replicas (a split view, for fault tests). Never set it in production")
	_ = fl.MarkHidden("test-freeze-view")
	fl.StringVar(&f.http, "http", httpDefault, "address for /healthz, /readyz and /metrics (empty: none)")
	fl.BoolVar(&f.console, "console", f.consoleDefault, "serve the read-only web console at / on --http")
	fl.BoolVar(&f.consolePayloads, "console-payloads", false, "show task payloads and headers in the console (hidden by default)")
	fl.StringVar(&f.httpToken, "http-token", "", "token the console requires (Authorization: Bearer, or its sign-in form); prefer CRONSTREAM_HTTP_TOKEN to keep it out of the process list")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.conn.addNATS(cmd)
	f.conn.addRedis(cmd)
}

func newRunCommand(g *globalFlags) *cobra.Command {
	f := &replicaFlags{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run one replica: projector, scheduler, recoverer and relay",
		Long: `Run one cronstream replica. Run several for availability: every replica
can fire every entry, exactly once, and recover every queue.

The replica keeps trying while NATS or Redis is unavailable (/readyz says
not ready meanwhile, the log says what it retries). What waiting cannot
fix stops it at start-up with the reason and a non-zero exit: credentials
NATS or Redis refuse, a missing permission, impossible stream settings.
It stops cleanly on SIGINT or SIGTERM: firing stops
after the batch in flight, the outbox is flushed to NATS, the heartbeat is
removed.

Stall detection: an entry whose tick is overdue for longer than
--late-after (default 30s after its due time plus jitter) is late, whatever
the cause (Redis refusing writes, a hung connection, fences). Late entries
show in /metrics (cronstream_late_entries, per queue, and the oldest
overdue tick's age), as one warning per entry per minute naming the tick
and the last refusal or error, and in cronstream status. /readyz fails
while every fire attempt of this replica has failed or been refused for
longer than --late-after.

--test-clock-offset (CRONSTREAM_TEST_CLOCK_OFFSET) is for fault tests only.`,
		Example: `  cronstream run --nats nats://nats:4222 --redis redis://redis:6379 --replicas 3
  cronstream run --redis rediss://cronstream@redis:6380 --redis-password-file /run/secrets/redis --nats-creds /run/secrets/nats.creds
  cronstream run --redis rediss://redis:6380 --redis-tls-ca ca.pem --redis-tls-cert client.pem --redis-tls-key client-key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(g)
			if err != nil {
				return err
			}
			return replica.Run(cmd.Context(), cfg)
		},
	}
	f.add(cmd, ":8080")
	return cmd
}

// config builds the replica configuration from the flags.
func (f *replicaFlags) config(g *globalFlags) (replica.Config, error) {
	names, err := g.names()
	if err != nil {
		return replica.Config{}, err
	}
	// Impossible stream settings are a usage error, not an outage.
	streams := events.StreamConfig{Names: names, Replicas: f.replicas, ActivityMaxAge: f.activityMaxAge}
	if _, err := streams.ActivityStreamConfig(); err != nil {
		return replica.Config{}, fmt.Errorf("--replicas %d, --activity-max-age %s: %w", f.replicas, f.activityMaxAge, err)
	}
	if f.removedKeyGrace <= 0 {
		return replica.Config{}, fmt.Errorf("--removed-key-grace %s: must be positive", f.removedKeyGrace)
	}
	log, err := newLogger(g, f.logFormat, f.logLevel)
	if err != nil {
		return replica.Config{}, err
	}
	// go-redis reports each failed dial itself; the replica says what it
	// could not do, so the library's lines are debug detail.
	redis.SetLogger(redisLog{log})
	f.conn.warn = func(msg string) { log.Warn(msg) }
	rc, err := openRedis(g, &f.conn)
	if err != nil {
		return replica.Config{}, err
	}
	maxOutboxBytes, err := f.outboxBound()
	if err != nil {
		return replica.Config{}, err
	}
	waitReplicas, err := f.waitReplicas()
	if err != nil {
		return replica.Config{}, err
	}
	var queues []string
	for _, q := range f.queues {
		if q = strings.TrimSpace(q); q != "" {
			queues = append(queues, q)
		}
	}
	return replica.Config{
		NATSURL: g.nats, NATSOptions: f.conn.natsOptions(g), Redis: rc,
		Names: names, ReplicaID: f.replicaID, Version: readBuildInfo().Version, Revision: readBuildInfo().Revision,
		StreamReplicas: f.replicas, ActivityMaxAge: f.activityMaxAge,
		MaxStaleness: f.maxStaleness, MaxOutboxBytes: maxOutboxBytes, LateAfter: f.lateAfter, ClockOffset: f.clockOffset, FreezeViewFile: f.freezeView,
		RedisWaitReplicas: waitReplicas, RedisWaitTimeout: f.redisWaitTimeout,
		Queues: queues, RecoverInterval: f.recoverInterval, RecoverGrace: f.recoverGrace, RemovedKeyGrace: f.removedKeyGrace,
		HTTPAddr: f.http, Console: f.consoleConfig(), Logger: log, MetricsPerEntry: f.metricsPerEntry,
	}, nil
}

// consoleConfig is the console's configuration, nil when it is off.
func (f *replicaFlags) consoleConfig() *console.Config {
	if !f.console || f.http == "" {
		return nil
	}
	return &console.Config{Payloads: f.consolePayloads, Token: f.httpToken}
}

// redisLog passes go-redis's log lines to the replica's logger at debug.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// outboxBound is --max-outbox-bytes, or the deprecated --max-outbox (a
// record count) converted to bytes.
func (f *replicaFlags) outboxBound() (int64, error) {
	if f.maxOutbox == 0 {
		return f.maxOutboxBytes.n, nil
	}
	if f.maxOutboxBytes.set {
		return 0, errors.New("--max-outbox and --max-outbox-bytes given: --max-outbox is deprecated, give --max-outbox-bytes only")
	}
	if f.maxOutbox < 0 {
		return 0, fmt.Errorf("--max-outbox %d: must be positive (and is deprecated: use --max-outbox-bytes)", f.maxOutbox)
	}
	return min(f.maxOutbox, math.MaxInt64/taskstate.OutboxRecordBytes) * taskstate.OutboxRecordBytes, nil
}

// maxWaitTimeout bounds --redis-wait-timeout: the relay's pass visits the
// outboxes one after another, and a WAIT holds it. One longer than what is
// left of the outbox lease (3 s, renewed just before the WAIT) lets the
// lease lapse: the batch is then published again by the outbox's next
// holder, and the stream drops the duplicates.
const maxWaitTimeout = 5 * time.Second

// waitReplicas reads --redis-wait-replicas and checks --redis-wait-timeout.
func (f *replicaFlags) waitReplicas() (int, error) {
	if f.redisWaitTimeout <= 0 || f.redisWaitTimeout > maxWaitTimeout {
		return 0, fmt.Errorf("--redis-wait-timeout %s: must be above 0 and at most %s", f.redisWaitTimeout, maxWaitTimeout)
	}
	v := strings.TrimSpace(f.redisWaitReplicas)
	if strings.EqualFold(v, "auto") {
		return relay.WaitAuto, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--redis-wait-replicas %q: give auto, or a number of replicas (0 for none)", f.redisWaitReplicas)
	}
	return n, nil
}

// byteSize is a flag holding a positive size in bytes, given as a number of
// bytes or with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB as powers of
// 1000).
type byteSize struct {
	n   int64
	set bool // given on the command line or in the environment
}

var byteUnits = []struct {
	name string
	size int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}

func (b *byteSize) String() string {
	for _, u := range byteUnits[:4] {
		if b.n >= u.size && b.n%u.size == 0 {
			return strconv.FormatInt(b.n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(b.n, 10)
}

func (b *byteSize) Set(s string) error {
	num, unit := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if len(num) > len(u.name) && strings.EqualFold(num[len(num)-len(u.name):], u.name) {
			num, unit = strings.TrimSpace(num[:len(num)-len(u.name)]), u.size
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a size: want a positive number of bytes, or one with KiB, MiB or GiB", s)
	}
	if n > math.MaxInt64/unit {
		return fmt.Errorf("%q is too large", s)
	}
	b.n, b.set = n*unit, true
	return nil
}

func (b *byteSize) Type() string { return "size" }
