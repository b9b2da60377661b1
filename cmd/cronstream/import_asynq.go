package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/asynqimport"
	"github.com/cronstream/cronstream/internal/redact"
	"github.com/cronstream/cronstream/internal/taskstate"
)

func init() { subcommands = append(subcommands, newImportCommand) }

func newImportCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Bring the periodic entries of another scheduler over",
		Long: `Read the periodic entries another scheduler runs and write them as a
schedules file that "cronstream sync -f" reads. asynq is the one so far:
see "cronstream import asynq --help".`,
		Example: `  cronstream import asynq --redis redis://10.0.0.5:6379 --output-file asynq.yaml`,
	}
	cmd.AddCommand(newImportAsynqCommand(g))
	return cmd
}

// importFlags are import asynq's flags.
type importFlags struct {
	conn     connFlags
	out      string
	timezone string
	skip     bool
	cutover  bool
	owner    string
	settle   time.Duration
}

func newImportAsynqCommand(g *globalFlags) *cobra.Command {
	var f importFlags
	cmd := &cobra.Command{
		Use:   "asynq [--redis URL] [--output-file FILE] [--timezone ZONE] [--cutover]",
		Short: "Read the entries of running asynq schedulers into a schedules file",
		Long: `Read the periodic entries that running asynq schedulers (asynq.Scheduler,
asynq.PeriodicTaskManager) publish in Redis — asynq:schedulers and each
scheduler's entry list — and write them as a schedules file that
"cronstream sync -f" reads (stdout without -o). Nothing is written to Redis.

Each registration becomes one entry: its cron spec, task type, payload and
the options given to Register (queue, max retry, timeout, unique,
retention, group). The entry id is the task type and a hash of the
registration: the id asynqcompat.Scheduler.Register derives for the same
registration, so a program moved to package asynqcompat takes its imported
entries over. The same registration in several scheduler processes (each
of which enqueues every tick, so asynq fires it once per process) becomes
one entry. The entries cronstream itself lists in asynq:schedulers (for
asynq's CLI and asynqmon) are left out.

What asynq does not store cannot come over, and every entry says so on
stderr: the task's headers, the options given to asynq.NewTask rather than
to Register, and the scheduler's time zone (SchedulerOpts.Location; give
it with --timezone, UTC otherwise, asynq's default). A time zone that does
not fit the next run asynq listed for an entry is warned about by name.
An option a periodic entry cannot carry (TaskID, ProcessAt, ProcessIn, an
absolute Deadline) makes the registration an error: nothing is written,
unless --skip-unsupported leaves such registrations out.

--cutover hands the entries over from asynq to cronstream so that every
tick is enqueued exactly once: run it while the asynq schedulers run and
the cronstream replicas run. It takes each entry's enqueue history as
asynq writes it, tells you to stop the asynq schedulers, and waits for
them to stop (asynq's Shutdown deletes that history, which is why it is
taken as it is written); then it registers every entry with start_at the
second after the last tick asynq enqueued of it, fires the ticks that fell
between that and the registration (a backfill: they are late by the
cutover's length, never lost or doubled), and writes the file with those
start_at values. It needs NATS (--nats) as well as Redis, and refuses
entries that already exist in cronstream. docs/migrating-from-asynq.md
has the whole procedure.`,
		Example: `  cronstream import asynq --redis redis://10.0.0.5:6379 --output-file asynq.yaml
  cronstream import asynq --timezone Europe/Berlin | cronstream sync -f - --dry-run
  cronstream import asynq --cutover --timezone Europe/Berlin --output-file asynq.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.timezone != "" {
				if _, err := (events.Entry{Timezone: f.timezone}).Location(); err != nil {
					return usagef("--timezone: %v", err)
				}
			}
			if f.cutover && f.skip {
				return usagef("--cutover and --skip-unsupported: a registration left out would stop firing at the cutover; fix it in asynq first")
			}
			if !f.cutover && (cmd.Flags().Changed("owner") || cmd.Flags().Changed("cutover-settle")) {
				return usagef("--owner and --cutover-settle go with --cutover")
			}
			return runImportAsynq(cmd, g, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "output-file", "", "write the schedules file here instead of stdout (-o names output formats on every command, so a file has a flag of its own)")
	fl.StringVar(&f.timezone, "timezone", "", "IANA time zone of the entries: the asynq schedulers' SchedulerOpts.Location (default UTC)")
	fl.BoolVar(&f.skip, "skip-unsupported", false, "leave out registrations with an option cronstream cannot carry, instead of failing")
	fl.BoolVar(&f.cutover, "cutover", false, "hand the entries over: wait for the asynq schedulers to stop, then register each after its last enqueue (needs NATS)")
	fl.StringVar(&f.owner, "owner", configsync.DefaultOwner, "with --cutover: owner label of the entries registered (sync -f's default, so syncing the file later changes nothing)")
	fl.DurationVar(&f.settle, "cutover-settle", asynqimport.DefaultSettle, "with --cutover: how long to keep capturing enqueues after the last scheduler stopped")
	addConn(cmd, &f.conn, true)
	return cmd
}

func runImportAsynq(cmd *cobra.Command, g *globalFlags, f *importFlags) error {
	ctx := cmd.Context()
	store, rc, err := openStore(ctx, g, &f.conn)
	if err != nil {
		return err
	}
	defer rc.Close()
	r, err := asynqimport.Read(ctx, store, asynqimport.Options{Timezone: f.timezone})
	stderr := cmd.ErrOrStderr()
	if errors.Is(err, asynqimport.ErrNoSchedulers) {
		return fmt.Errorf("%w in the Redis at %s (%s): asynq:schedulers lists no live scheduler entry list; run this while the asynq schedulers run",
			err, redact.URL(g.redis), describeSkipped(r))
	}
	if err != nil {
		return err
	}
	if err := reportProblems(stderr, r, f.skip); err != nil {
		return err
	}
	if f.cutover {
		return runCutover(cmd, g, f, store, r)
	}
	entries := make([]events.Entry, 0, len(r.Entries))
	for _, e := range r.Entries {
		reportWarnings(stderr, e)
		entries = append(entries, e.Entry)
	}
	if err := writeImport(cmd, f.out, header(g, r, false), entries); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "imported %s from %s\n", plural(len(entries), "entry", "entries"), plural(len(r.Schedulers), "asynq scheduler", "asynq schedulers"))
	return nil
}

// describeSkipped says what asynq:schedulers held that is not a running
// asynq scheduler.
func describeSkipped(r asynqimport.Result) string {
	return fmt.Sprintf("%d stopped without clearing their list, %d of cronstream's own", len(r.Stale), len(r.Own))
}

// reportProblems prints each registration that does not convert; unless
// skip, they fail the import.
func reportProblems(w io.Writer, r asynqimport.Result, skip bool) error {
	if r.Undecodable > 0 {
		fmt.Fprintf(w, "warning: %d scheduler list elements are not asynq SchedulerEntries and were ignored\n", r.Undecodable)
	}
	if len(r.Problems) == 0 {
		return nil
	}
	verb := "cannot be imported"
	if skip {
		verb = "left out (--skip-unsupported)"
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "%s %s: registration %s (%s %s) of scheduler %s:\n", terminalSafe(p.Type), verb, terminalSafe(p.Source.EntryID),
			terminalSafe(p.Source.Spec), terminalSafe(p.Type), terminalSafe(p.Source.Scheduler))
		for _, line := range strings.Split(p.Err.Error(), "\n") {
			fmt.Fprintf(w, "  %s\n", terminalSafe(line))
		}
	}
	if skip {
		return nil
	}
	return fmt.Errorf("%s cannot be imported; nothing was written (--skip-unsupported leaves them out)", plural(len(r.Problems), "registration", "registrations"))
}

// reportWarnings prints an entry's warnings, one line each.
func reportWarnings(w io.Writer, e asynqimport.Entry) {
	from := plural(len(e.Sources), "scheduler", "schedulers")
	for _, warn := range e.Warnings {
		fmt.Fprintf(w, "warning: entry %s (%s %q, from %s): %s\n", e.Entry.ID, terminalSafe(e.Entry.Task.Type), e.Entry.Cron, from, terminalSafe(warn))
	}
}

// header is the comment at the top of the written file.
func header(g *globalFlags, r asynqimport.Result, cutover bool) string {
	var b strings.Builder
	how := "cronstream import asynq"
	if cutover {
		how += " --cutover"
	}
	fmt.Fprintf(&b, "# Imported by `%s` from %s on %s,\n", how, redact.URL(g.redis), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "# from %s. asynq does not store headers, options given to\n", plural(len(r.Schedulers), "asynq scheduler", "asynq schedulers"))
	b.WriteString("# asynq.NewTask, or the scheduler's time zone: check them (the warnings named each entry).\n")
	return b.String()
}

// writeImport writes the schedules file to out (stdout when "" or "-").
func writeImport(cmd *cobra.Command, out, head string, entries []events.Entry) error {
	var b bytes.Buffer
	b.WriteString(head)
	if err := configsync.ExportUnowned(&b, entries); err != nil {
		return err
	}
	if out == "" || out == "-" {
		_, err := cmd.OutOrStdout().Write(b.Bytes())
		return err
	}
	if err := writeFileAtomic(out, b.Bytes()); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", terminalSafe(out))
	return nil
}

// storeTime is the Redis clock as a func, for what must not run ahead of
// the replicas' clock (which is corrected to Redis TIME).
func storeTime(ctx context.Context, store *taskstate.Store) (func() time.Time, error) {
	rt, err := store.Time(ctx)
	if err != nil {
		return nil, err
	}
	offset := time.Until(rt)
	return func() time.Time { return time.Now().Add(offset) }, nil
}
