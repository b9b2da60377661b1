// Command cronstream runs cronstream replicas and manages periodic entries,
// config as code and the audit log.
//
// Every flag can also be set from the environment: --redis-url-style flag
// names map to CRONSTREAM_<NAME> with dashes as underscores
// (--nats → CRONSTREAM_NATS, --max-staleness → CRONSTREAM_MAX_STALENESS). A
// flag given on the command line wins over the environment.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cronstream:", err)
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		os.Exit(1)
	}
}

// exitCode lets a command choose its exit status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// globalFlags are shared by every command.
type globalFlags struct {
	nats      string
	natsCreds string
	redis     string
	prefix    string
	json      bool
}

func newRootCommand() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "cronstream",
		Short: "Event-sourced periodic tasks and task recovery for asynq",
		Long: `cronstream fires periodic asynq tasks exactly once across any number of
replicas and recovers tasks whose worker died. Configuration changes,
fires and recoveries are events in NATS JetStream: the audit log.

Start here:  cronstream dev
Then:        cronstream entry put hello --cron "@every 10s" --type demo:hello
             cronstream audit --follow`,
		Example: `  cronstream dev
  export CRONSTREAM_NATS=nats://127.0.0.1:4222 CRONSTREAM_REDIS=redis://127.0.0.1:6379
  cronstream entry put hello --cron "@every 10s" --type demo:hello
  cronstream audit --follow
  cronstream sync -f schedules.yaml --prune
  cronstream status`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.nats, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	pf.StringVar(&g.natsCreds, "nats-creds", "", "NATS credentials file")
	pf.StringVar(&g.redis, "redis", "redis://127.0.0.1:6379", "Redis URL (redis://, rediss://, redis-sentinel://, or a comma-separated cluster list)")
	pf.StringVar(&g.prefix, "prefix", "cronstream", "subject prefix; streams are <PREFIX>_CONFIG and <PREFIX>_ACTIVITY")
	root.AddCommand(commands(g)...)
	return root
}

// commands is filled by the files of each subcommand.
var subcommands []func(*globalFlags) *cobra.Command

func commands(g *globalFlags) []*cobra.Command {
	out := make([]*cobra.Command, 0, len(subcommands))
	for _, f := range subcommands {
		out = append(out, f(g))
	}
	return out
}

// applyEnv sets every flag not given on the command line from
// CRONSTREAM_<FLAG_NAME> when that variable is set.
func applyEnv(cmd *cobra.Command) error {
	var errs []error
	visit := func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := envName(f.Name)
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return errors.Join(errs...)
}

// envName is the environment variable of a flag.
func envName(flag string) string {
	return "CRONSTREAM_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
