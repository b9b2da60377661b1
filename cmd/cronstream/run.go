package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/replica"
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
	http            string
	logFormat       string
	logLevel        string
}

func (f *replicaFlags) add(cmd *cobra.Command, httpDefault string) {
	fl := cmd.Flags()
	fl.StringVar(&f.replicaID, "replica-id", "", "this replica's id (default host-pid-random)")
	fl.IntVar(&f.replicas, "replicas", 1, "stream replicas when creating missing streams: 1 for development, 3 for production (R3); existing streams are changed only by \"cronstream streams apply\"")
	fl.DurationVar(&f.activityMaxAge, "activity-max-age", events.DefaultActivityMaxAge, "how long the activity stream keeps fire and recovery events, when creating it (\"cronstream streams apply\" changes it)")
	fl.StringSliceVar(&f.queues, "queues", nil, "queues to recover (default: every queue in asynq:queues)")
	fl.DurationVar(&f.recoverInterval, "recover-interval", 5*time.Second, "how often the recoverer looks for lease-expired tasks")
	fl.DurationVar(&f.recoverGrace, "recover-grace", 20*time.Second, "recover a task once its lease has been expired this long (asynq's own recoverer uses 30s)")
	fl.DurationVar(&f.maxStaleness, "max-staleness", 30*time.Second, "stop firing when this replica has not heard the config stream for this long while others have")
	fl.Int64Var(&f.maxOutbox, "max-outbox", 100_000, "pause firing while more outbox records than this wait for NATS")
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
not ready meanwhile, the log says what it retries). What waiting cannot
fix stops it at start-up with the reason and a non-zero exit: credentials
NATS or Redis refuse, a missing permission, impossible stream settings.
It stops cleanly on SIGINT or SIGTERM: firing stops
after the batch in flight, the outbox is flushed to NATS, the heartbeat is
removed.`,
		Example: `  cronstream run --nats nats://nats:4222 --redis redis://redis:6379 --replicas 3
  cronstream run --redis rediss://cronstream@redis:6380 --redis-password-file /run/secrets/redis --nats-creds /run/secrets/nats.creds`,
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
	log, err := newLogger(g, f.logFormat, f.logLevel)
	if err != nil {
		return replica.Config{}, err
	}
	// go-redis reports each failed dial itself; the replica says what it
	// could not do, so the library's lines are debug detail.
	redis.SetLogger(redisLog{log})
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
		Names: names, ReplicaID: f.replicaID, Version: readBuildInfo().Version, Revision: readBuildInfo().Revision,
		StreamReplicas: f.replicas, ActivityMaxAge: f.activityMaxAge,
		MaxStaleness: f.maxStaleness, MaxOutbox: f.maxOutbox,
		Queues: queues, RecoverInterval: f.recoverInterval, RecoverGrace: f.recoverGrace,
		HTTPAddr: f.http, Logger: log,
	}, nil
}

// redisLog passes go-redis's log lines to the replica's logger at debug.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
