package main

import (
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/replica"
	"github.com/cronstream/cronstream/stall"
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
	maxStaleness    time.Duration
	maxOutbox       int64
	lateAfter       time.Duration
	clockOffset     time.Duration
	http            string
	logFormat       string
	logLevel        string
}

func (f *replicaFlags) add(cmd *cobra.Command, httpDefault string) {
	fl := cmd.Flags()
	fl.StringVar(&f.replicaID, "replica-id", "", "this replica's id (default host-pid-random)")
	fl.IntVar(&f.replicas, "replicas", 1, "stream replicas: 1 for development, 3 for production (R3)")
	fl.DurationVar(&f.activityMaxAge, "activity-max-age", events.DefaultActivityMaxAge, "how long the activity stream keeps fire and recovery events")
	fl.StringSliceVar(&f.queues, "queues", nil, "queues to recover (default: every queue in asynq:queues)")
	fl.DurationVar(&f.recoverInterval, "recover-interval", 5*time.Second, "how often the recoverer looks for lease-expired tasks")
	fl.DurationVar(&f.recoverGrace, "recover-grace", 20*time.Second, "recover a task once its lease has been expired this long (asynq's own recoverer uses 30s)")
	fl.DurationVar(&f.maxStaleness, "max-staleness", 30*time.Second, "stop firing when this replica has not heard the config stream for this long while others have")
	fl.Int64Var(&f.maxOutbox, "max-outbox", 100_000, "pause firing while more outbox records than this wait for NATS")
	fl.DurationVar(&f.lateAfter, "late-after", stall.DefaultLateAfter, "an entry whose tick is overdue (due time plus jitter) for longer is late: metrics, a warning, status, and /readyz when this replica's own fires all fail")
	fl.DurationVar(&f.clockOffset, "test-clock-offset", 0, "TEST ONLY: run this replica's local clock this far off (e.g. 1h, -1h) to test clock skew; the replica corrects it against Redis TIME. Never set it in production")
	fl.StringVar(&f.http, "http", httpDefault, "address for /healthz, /readyz and /metrics (empty: none)")
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
not ready meanwhile) and stops cleanly on SIGINT or SIGTERM: firing stops
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
  CRONSTREAM_REDIS=rediss://user:pass@redis:6380 cronstream run --http :8080`,
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
	log, err := newLogger(f.logFormat, f.logLevel)
	if err != nil {
		return replica.Config{}, err
	}
	rc, err := openRedis(g, &f.conn)
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
		Names: names, ReplicaID: f.replicaID, Version: version,
		StreamReplicas: f.replicas, ActivityMaxAge: f.activityMaxAge,
		MaxStaleness: f.maxStaleness, MaxOutbox: f.maxOutbox, LateAfter: f.lateAfter, ClockOffset: f.clockOffset,
		Queues: queues, RecoverInterval: f.recoverInterval, RecoverGrace: f.recoverGrace,
		HTTPAddr: f.http, Logger: log,
	}, nil
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"
