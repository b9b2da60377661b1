package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/internal/redact"
	"github.com/cronstream/cronstream/internal/replica"
)

func init() { subcommands = append(subcommands, newDevCommand) }

func newDevCommand(g *globalFlags) *cobra.Command {
	f := &replicaFlags{consoleDefault: true}
	var dataDir string
	var natsPort int
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a replica with an embedded NATS server: no other setup",
		Long: `Run cronstream for development: an embedded NATS server with JetStream
(data in --data-dir), Redis from --redis or else a redis-server started from
PATH or else an in-process Redis-compatible server (development only), and
one replica. It prints the NATS and Redis URLs so other cronstream commands
and your asynq workers can connect.`,
		Example: `  cronstream dev
  cronstream dev --data-dir /tmp/cs --nats-port 14222 --redis redis://127.0.0.1:6379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg, err := f.config(g)
			if err != nil {
				return err
			}
			log := cfg.Logger
			ns, err := startEmbeddedNATS("127.0.0.1", natsPort, filepath.Join(dataDir, "nats"))
			if err != nil {
				return err
			}
			defer ns.Shutdown()
			natsURL := ns.ClientURL()
			redisURL := g.redis
			if !flagOrEnvSet(cmd, "redis") {
				dr, err := startDevRedis(ctx, filepath.Join(dataDir, "redis"), log)
				if err != nil {
					return err
				}
				defer dr.stop()
				redisURL = dr.URL
				g.redis = dr.URL
				if cfg.Redis, err = openRedis(g, &f.conn); err != nil {
					return err
				}
				cfg.SkipRedisChecks = dr.Kind == "in-process"
				if dr.Kind == "in-process" {
					cfg.RedisWaitReplicas = 0 // it has no replicas, nor INFO replication
				}
				log.Info("redis", "kind", dr.Kind, "url", dr.URL)
			}
			cfg.NATSURL = natsURL
			cfg.Ready = func(httpAddr string) {
				// URLs as shown carry no password; the hint is quoted so
				// pasting it runs what it says (a cluster URL's & would
				// background the command).
				shownRedis := redact.URL(redisURL)
				fmt.Fprintf(os.Stdout, "cronstream dev is running\n  NATS:  %s\n  Redis: %s\n  HTTP:  %s\n  data:  %s\n\n"+
					"Try, in another shell:\n"+
					"  export CRONSTREAM_NATS=%s CRONSTREAM_REDIS=%s\n"+
					"  cronstream entry put hello --cron '@every 10s' --type demo:hello\n"+
					"  cronstream audit --follow\n", terminalSafe(natsURL), terminalSafe(shownRedis), terminalSafe(httpAddr), terminalSafe(dataDir),
					shellQuote(natsURL), shellQuote(shownRedis))
				if cfg.Console != nil && httpAddr != "" {
					fmt.Fprintf(os.Stdout, "  open http://%s/   (the console)\n", terminalSafe(httpAddr))
				}
				if shownRedis != redisURL {
					fmt.Fprintf(os.Stdout, "  (the Redis password is not shown: put it in CRONSTREAM_REDIS yourself, or use --redis-password-file)\n")
				}
			}
			err = replica.Run(ctx, cfg)
			ns.Shutdown()
			ns.WaitForShutdown()
			return err
		},
	}
	f.add(cmd, "127.0.0.1:8080")
	cmd.Flags().StringVar(&dataDir, "data-dir", "./.cronstream", "where the embedded NATS and the dev Redis keep their data, and the Redis port (a restart keeps its URL)")
	cmd.Flags().IntVar(&natsPort, "nats-port", 4222, "port of the embedded NATS server on 127.0.0.1 (-1: any free port)")
	return cmd
}

// flagOrEnvSet reports whether a flag was given on the command line or by
// its environment variable.
func flagOrEnvSet(cmd *cobra.Command, name string) bool {
	if f := cmd.Flag(name); f != nil && f.Changed {
		return true
	}
	_, ok := os.LookupEnv(envName(name))
	return ok
}
