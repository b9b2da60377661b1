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
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/redact"
)

func main() {
	// Commands report a Redis failure once, in their own words; go-redis
	// would add its pool's retries to stderr first. Replicas route it to
	// their logger (replicaFlags.config).
	redis.SetLogger(discardRedisLog{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	g := &globalFlags{secrets: &redact.Scrubber{}}
	err := newRootCommand(g).ExecuteContext(ctx)
	stop()
	if err != nil {
		if !errors.Is(err, errChangesPending) {
			// The last net: whatever a library echoed of a URL or password.
			fmt.Fprintln(os.Stderr, "cronstream:", terminalSafeLines(g.secrets.String(err.Error())))
		}
		os.Exit(exitStatus(err))
	}
}

// Exit statuses; the root command's help documents them.
const (
	exitError          = 1
	exitChangesPending = 2 // only sync --dry-run --detailed-exitcode
	exitNotFound       = 3
	exitConflict       = 4
	exitUnavailable    = 5
	exitUsage          = 64 // as sysexits.h's EX_USAGE
)

const exitStatusHelp = `Exit status:
  0   success
  1   error
  2   changes pending (only sync --dry-run --detailed-exitcode)
  3   not found (an entry that does not exist, or never did for audit --entry)
  4   revision conflict (--if-revision, a concurrent change, or a bulk write's entry changed since shown)
  5   NATS or Redis unavailable (also a follow told --exit-on-disconnect)
  64  usage: bad flags, arguments or values, in flags or a schedules file (the field named), or more changes than --max-changes without --yes`

// Sentinel errors that choose an exit status; exitStatus maps them, and
// the errors of the packages below, in this one place.
var (
	// errUsage is wrapped by usageError.
	errUsage = errors.New("usage")
	// errChangesPending: sync --dry-run --detailed-exitcode found a
	// difference. Not a failure: nothing is printed for it.
	errChangesPending = errors.New("changes pending")
)

// usageError is a bad flag or argument (exit status 64).
type usageError struct{ err error }

func (e usageError) Error() string   { return e.err.Error() }
func (e usageError) Unwrap() []error { return []error{e.err, errUsage} }

// usagef makes a usage error.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitStatus is the exit status of a command that failed with err.
func exitStatus(err error) int {
	var ec exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return int(ec)
	case errors.Is(err, errChangesPending):
		return exitChangesPending
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, events.ErrNotFound):
		return exitNotFound
	case errors.Is(err, events.ErrRevisionConflict):
		return exitConflict
	case unavailable(err):
		return exitUnavailable
	}
	return exitError
}

// unavailable reports whether err says NATS or Redis could not be reached
// or did not answer in time (not: refused the credentials, or a bad URL).
func unavailable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns) ||
		errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED)
}

// exitCode lets a command choose its exit status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// asUsageErrors makes the argument and flag errors of cmd and its
// subcommands usage errors, and makes a group command runnable (printing
// its help) so a mistyped subcommand is an error rather than help with
// exit status 0.
func asUsageErrors(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		cmd.Args = cobra.NoArgs
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if args := cmd.Args; args != nil {
		cmd.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		asUsageErrors(c)
	}
}

// globalFlags are shared by every command.
type globalFlags struct {
	nats      string
	natsCreds string
	redis     string
	prefix    string
	json      bool
	// secrets holds the URLs and passwords given, so nothing printed
	// carries them (see registerSecrets).
	secrets *redact.Scrubber
}

func newRootCommand(g *globalFlags) *cobra.Command {
	if g.secrets == nil {
		g.secrets = &redact.Scrubber{}
	}
	root := &cobra.Command{
		Use:   "cronstream",
		Short: "Event-sourced periodic tasks and task recovery for asynq",
		Long: `cronstream fires periodic asynq tasks exactly once across any number of
replicas and recovers tasks whose worker died. Configuration changes,
fires and recoveries are events in NATS JetStream: the audit log.

Start here:  cronstream dev
Then:        cronstream entry put hello --cron "@every 10s" --type demo:hello
             cronstream audit --follow

` + exitStatusHelp,
		Example: `  cronstream dev
  export CRONSTREAM_NATS=nats://127.0.0.1:4222 CRONSTREAM_REDIS=redis://127.0.0.1:6379
  cronstream entry put hello --cron "@every 10s" --type demo:hello
  cronstream audit --follow
  cronstream sync -f schedules.yaml --prune
  cronstream status`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			err := applyEnv(cmd)
			registerSecrets(cmd, g)
			if err != nil {
				return usageError{err}
			}
			return nil
		},
		Version: versionString(),
	}
	root.SetVersionTemplate("cronstream {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.nats, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated (a password here shows in the process list: prefer --nats-creds)")
	pf.StringVar(&g.natsCreds, "nats-creds", "", "NATS credentials file (JWT and NKey seed): keeps NATS secrets out of URLs and the process list")
	pf.StringVar(&g.redis, "redis", "redis://127.0.0.1:6379", "Redis URL, redis:// or rediss:// (a cluster or sentinels: see --redis-cluster and --redis-sentinel-master; a password here shows in the process list: prefer --redis-password-file)")
	pf.StringVar(&g.prefix, "prefix", "cronstream", "subject prefix; streams are <PREFIX>_CONFIG and <PREFIX>_ACTIVITY")
	root.AddCommand(commands(g)...)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	addCompletions(root, g)
	asUsageErrors(root)
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

// registerSecrets gives g.secrets every URL and password flag's value, from
// the command line or the environment.
func registerSecrets(cmd *cobra.Command, g *globalFlags) {
	g.secrets.AddURL(g.nats)
	g.secrets.AddURL(g.redis)
	if f := cmd.Flags().Lookup("redis-password"); f != nil {
		g.secrets.AddSecret(f.Value.String())
	}
	if f := cmd.Flags().Lookup("http-token"); f != nil {
		g.secrets.AddSecret(f.Value.String())
	}
}

// discardRedisLog silences go-redis's own logging.
type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// envName is the environment variable of a flag.
func envName(flag string) string {
	return "CRONSTREAM_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
