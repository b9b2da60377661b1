package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
)

func init() { subcommands = append(subcommands, newSyncCommand) }

// syncAction is one action of `sync --json`.
type syncAction struct {
	Kind        string   `json:"kind"` // create, update, remove
	ID          string   `json:"id"`
	Revision    uint64   `json:"revision"`               // before
	NewRevision uint64   `json:"new_revision,omitempty"` // after (not with --dry-run)
	Changes     []string `json:"changes,omitempty"`
	Error       string   `json:"error,omitempty"`
}

// syncReport is what `sync --json` prints.
type syncReport struct {
	DryRun    bool         `json:"dry_run"`
	Owner     string       `json:"owner"`
	Actions   []syncAction `json:"actions"`
	Unchanged []string     `json:"unchanged"`
	NotPruned []string     `json:"not_pruned,omitempty"`
	// Capacity is the schedule after the sync against what the live
	// replicas have shown they can fire (absent when none has shown it,
	// or the plan changes nothing); Warnings say when it exceeds it.
	Capacity *capacityReport `json:"capacity,omitempty"`
	Warnings []string        `json:"warnings,omitempty"`
}

// syncFlags are sync's flags.
type syncFlags struct {
	conn   connFlags
	file   string
	prune  bool
	dryRun bool
	owner  string
	// selector narrows the sync to the entries whose labels match.
	selector string
	watch    time.Duration
	detail   bool
	maxSize  byteSize
	guard    guardFlags
	exitLost bool
}

func newSyncCommand(g *globalFlags) *cobra.Command {
	f := &syncFlags{maxSize: byteSize{n: configsync.DefaultMaxFileBytes}}
	cmd := &cobra.Command{
		Use:   "sync -f FILE",
		Short: "Config as code: make the entries match a schedules file",
		Long: `Make the registered entries match a schedules file (YAML, or JSON with the
same fields), publishing only the difference: entries that are new are
registered, changed ones updated, unchanged ones cost nothing.

The whole file is validated first: one invalid entry, an unknown field (a
typo) or an id given twice, and nothing is published; every problem is
listed with its entry and field.

Ownership: every entry sync writes carries --owner (default "sync"),
unless the file gives the entry an "owner:" (as "cronstream export" writes;
"" means none). --prune removes entries of --owner that the file no longer
lists, and nothing else: entries made with "entry put" (no owner) or by another owner
are never pruned. Pause state: sync never pauses or resumes an entry
unless the file says "paused:", so an entry paused by hand stays paused.
--selector (-l) narrows the sync to entries whose labels match
(team=payments, tier!=batch, team, !team; commas join): file entries that
do not match are left out, and --prune removes only live entries that do.

File format (the entry state's field names; durations as 30s, 10m, 1h):

  entries:
    - id: daily-report              # required, 1-128 of [A-Za-z0-9_-]
      cron: "0 9 * * *"             # required
      timezone: Europe/Berlin       # default UTC
      task:
        type: report:daily          # required
        payload: '{"team":"ops"}'   # a string (its bytes) or a mapping (encoded as JSON)
        # or payload_json: '{"team":"ops"}' (JSON text, kept as written; or a mapping)
        # or payload_base64: AAH/ (bytes); give exactly one of the three
        headers: {source: cron}
      options: {queue: reports, max_retry: 5, timeout: 10m, retention: 24h}
      catchup: {policy: latest, window: 1h}
      overlap: skip
      jitter: 30s
      paused: false
      owner: team-reports           # default --owner
      start_at: 2027-03-01T00:00:00Z  # no tick before (RFC 3339, or a date: UTC midnight)
      end_at: 2027-04-01            # no tick after; the entry then shows as ended
      exclude: ["* * 25 12 *"]      # cron specs in the entry's zone: matching ticks are skipped (excluded)
      labels: {team: reports}       # Kubernetes label rules; --selector matches them
      max_fires: 5                  # at most 5 scheduled ticks fire, then the entry shows as completed

--dry-run --detailed-exitcode exits 0 when the entries already match the
file, 2 when the plan has changes, 1 on an error (as terraform plan does):
a CI job can gate on drift. With or without --dry-run, an invalid file
(or one over --max-file-size) exits 64, as entry put does for the same
value in a flag; a file that cannot be read exits 1, NATS unreachable 5.

--watch re-reads the file and syncs on an interval until interrupted; a
file that becomes invalid is reported and the current entries are kept,
and so is a sync that would remove more than --max-changes entries (a
file emptied by mistake) unless --yes. While watching, a NATS that stops
answering is said on stderr within 5 s, and again when it is back
(--exit-on-disconnect: exit 5 instead).

--prune changes many entries at once: the plan is shown first and asked
about on a terminal ([y/N]); --yes applies it without asking. Without a
terminal, a plan with more than --max-changes (default 50) changes is
refused unless --yes. --dry-run only shows it.

--max-file-size (default 4MiB, some 15,000 entries as export writes them)
refuses a larger file before reading it (stdin once it has passed the
limit), with exit status 64. Checking a file takes memory: about 38 times
its size for ordinary entries, at most 256 times (plus 8 MiB) for the
costliest YAML, so the default bounds a hostile file at about 1 GiB.`,
		Example: `  cronstream sync -f schedules.yaml --dry-run
  cronstream sync -f schedules.yaml --prune
  cronstream sync -f schedules.yaml --dry-run --detailed-exitcode   # 0 in sync, 2 drift, 64 invalid file, 1 error
  cronstream sync -f schedules.yaml --owner team-billing --prune --watch 1m
  cronstream sync -f schedules.yaml --selector team=payments --prune
  generate-schedules | cronstream sync -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSync(cmd, g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "schedules file, YAML or JSON (- for stdin)")
	fl.BoolVar(&f.prune, "prune", false, "remove entries of --owner that the file does not list")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the plan (+ create, ~ update, - remove) and publish nothing")
	fl.StringVar(&f.owner, "owner", configsync.DefaultOwner, "owner label of the entries this file manages")
	addSelector(cmd, &f.selector, "manage only entries whose labels match", ": others in the file are left out, others live are never pruned")
	fl.BoolVar(&f.detail, "detailed-exitcode", false, "with --dry-run: exit 0 when nothing would change, 2 when the plan has changes (64 for an invalid file, 1 on another error)")
	fl.DurationVar(&f.watch, "watch", 0, "re-sync on this interval until interrupted (e.g. 1m)")
	fl.BoolVar(&g.json, "json", false, "print the plan and its outcome as JSON")
	fl.Var(&f.maxSize, "max-file-size", "refuse a schedules file larger than this, before reading it (bytes, or with KiB, MiB)")
	fl.BoolVar(&f.exitLost, "exit-on-disconnect", false, "with --watch: exit with status 5 when NATS stops answering")
	f.guard.addConfirm(cmd)
	addConn(cmd, &f.conn, false)
	return cmd
}

// runSync checks the flags and the whole file, plans against the live
// entries, shows the plan (a dry run stops there), asks before a prune,
// applies it and, with --watch, keeps syncing.
func runSync(cmd *cobra.Command, g *globalFlags, f *syncFlags) error {
	ctx := cmd.Context()
	sel, err := f.check()
	if err != nil {
		return err
	}
	cfgs, err := f.load(cmd)
	if err != nil {
		return err
	}
	f.conn.reconnectForever = f.watch > 0
	s, err := openSession(g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()
	all, streamsExist, err := f.current(ctx, s)
	if err != nil {
		return err
	}
	current, cfgs := configsync.Select(all, cfgs, sel)
	plan := configsync.MakePlan(current, cfgs, f.owner, f.prune)
	var capRep *capacityReport
	var warnings []string
	if streamsExist { // retention and capacity are only known once the streams exist
		if err := checkPlanCatchup(ctx, s, plan); err != nil {
			return err
		}
		if !plan.Empty() {
			capRep, warnings = syncCapacity(ctx, s, all, plan, cmd.ErrOrStderr())
		}
	}
	warnings = append(warnings, syncJitterWarnings(plan, time.Now(), cmd.ErrOrStderr())...)
	w := cmd.OutOrStdout()
	if f.dryRun {
		if err := f.print(w, g.json, plan, nil, capRep, warnings); err != nil {
			return err
		}
		if f.detail && !plan.Empty() {
			return errChangesPending
		}
		return nil
	}
	if f.prune && !plan.Empty() {
		ok, err := f.guard.confirm(cmd, "apply", len(plan.Actions), "change", "changes", func(pw io.Writer) { printPlan(pw, plan, f.owner, false) })
		if err != nil || !ok {
			return err
		}
	}
	outcomes, applyErr := configsync.Apply(ctx, s.client, plan)
	if err := f.print(w, g.json, plan, outcomes, capRep, warnings); err != nil {
		return err
	}
	if applyErr != nil {
		return fmt.Errorf("sync: %w", applyErr)
	}
	if f.watch == 0 {
		return nil
	}
	return f.watchFile(cmd, s, sel)
}

// check refuses flags that contradict each other before anything is read
// or connected, and returns the parsed --selector.
func (f *syncFlags) check() (events.Selector, error) {
	switch {
	case f.file == "":
		return events.Selector{}, usagef("sync needs -f FILE (or -f - for stdin)")
	case f.owner == "":
		return events.Selector{}, usagef("--owner must not be empty: entries without an owner are never pruned")
	case f.watch < 0:
		return events.Selector{}, usagef("--watch must be positive")
	case f.watch > 0 && f.dryRun:
		return events.Selector{}, usagef("--watch and --dry-run: a dry run publishes nothing to watch for")
	case f.watch > 0 && f.file == "-":
		return events.Selector{}, usagef("--watch needs a file to re-read, not stdin")
	case f.detail && !f.dryRun:
		return events.Selector{}, usagef("--detailed-exitcode goes with --dry-run: it says whether the plan is empty")
	case f.exitLost && f.watch == 0:
		return events.Selector{}, usagef("--exit-on-disconnect applies to --watch only")
	}
	f.guard.dryRun = f.dryRun
	if err := (events.Entry{ID: "x", Cron: "@daily", Task: events.Task{Type: "x"}, Owner: f.owner}).Validate(); err != nil {
		return events.Selector{}, usagef("--owner %q: at most 128 bytes of UTF-8", f.owner)
	}
	return parseSelector(f.selector)
}

// load reads and validates the whole schedules file (-f, or stdin).
func (f *syncFlags) load(cmd *cobra.Command) ([]configsync.Config, error) {
	var cfgs []configsync.Config
	var err error
	if f.file == "-" {
		cfgs, err = configsync.Read(cmd.InOrStdin(), "stdin", f.maxSize.n)
	} else {
		cfgs, err = configsync.LoadFile(f.file, f.maxSize.n)
	}
	switch {
	case errors.Is(err, configsync.ErrFileTooLarge):
		return nil, usagef("%v; nothing was published (--max-file-size raises the limit)", err)
	case errors.Is(err, configsync.ErrInvalidConfig):
		// A value refused in the file is the value entry put refuses from
		// its flag: the same usage error (64), whichever way it came.
		return nil, usageError{fmt.Errorf("%w\nnothing was published", err)}
	}
	return cfgs, err
}

// current lists every live entry. A sync creates the streams first; a dry
// run creates nothing, so without streams there is simply nothing yet
// (streamsExist false).
func (f *syncFlags) current(ctx context.Context, s *session) (all []events.Current, streamsExist bool, err error) {
	if f.dryRun {
		if s.requireStreams(ctx) != nil {
			return nil, false, nil
		}
	} else if err := s.ensureStreams(ctx); err != nil {
		return nil, true, err
	}
	all, err = s.client.List(ctx)
	return all, true, err
}

// checkPlanCatchup checks every entry the plan writes against the
// activity stream's retention.
func checkPlanCatchup(ctx context.Context, s *session, plan configsync.Plan) error {
	for _, a := range plan.Actions {
		if a.Kind == configsync.Create || a.Kind == configsync.Update {
			if err := s.checkCatchup(ctx, a.Entry); err != nil {
				return err
			}
		}
	}
	return nil
}

// print prints the plan and, once applied, its outcomes: as text, or as
// one JSON report (--json).
func (f *syncFlags) print(w io.Writer, asJSON bool, plan configsync.Plan, outcomes []configsync.Outcome, capRep *capacityReport, warnings []string) error {
	if asJSON {
		return printJSON(w, newSyncReport(plan, outcomes, f.owner, f.dryRun).with(capRep, warnings))
	}
	printPlan(w, plan, f.owner, f.dryRun)
	printOutcomes(w, outcomes)
	return nil
}

// watchFile re-syncs the file every --watch until interrupted. While it
// watches, a NATS that stops answering is said on stderr, or ends the
// command with --exit-on-disconnect.
func (f *syncFlags) watchFile(cmd *cobra.Command, s *session, sel events.Selector) error {
	maxRemovals := f.guard.maxChanges
	if f.guard.yes {
		maxRemovals = 0
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	lost, stop := watchNATS(ctx, cancel, s, cmd.ErrOrStderr(), f.exitLost)
	defer stop()
	w := cmd.OutOrStdout()
	syncer := &configsync.Syncer{
		Provider: configsync.FileProvider{Path: f.file, MaxBytes: f.maxSize.n}, Client: s.client, Owner: f.owner, Prune: f.prune, Selector: sel,
		MaxRemovals: maxRemovals,
		Interval:    f.watch, Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)),
		OnSync: func(r configsync.Report) {
			if r.Err == nil && !r.Plan.Empty() {
				fmt.Fprintf(w, "%s synced %s:\n", fmtTime(time.Now()), f.file)
				printOutcomes(w, r.Outcomes)
			}
		},
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "watching %s: syncing every %s until interrupted\n", f.file, f.watch)
	if err := syncer.Run(ctx); err != nil {
		return err
	}
	if cmd.Context().Err() == nil {
		return lost()
	}
	return nil
}

func newSyncReport(p configsync.Plan, outcomes []configsync.Outcome, owner string, dryRun bool) syncReport {
	r := syncReport{DryRun: dryRun, Owner: owner, Actions: []syncAction{}, Unchanged: p.Unchanged, NotPruned: p.NotPruned}
	if r.Unchanged == nil {
		r.Unchanged = []string{}
	}
	for i, a := range p.Actions {
		sa := syncAction{Kind: string(a.Kind), ID: a.ID, Revision: a.Revision}
		if a.Kind == configsync.Update {
			for _, c := range a.Changes {
				sa.Changes = append(sa.Changes, c.String())
			}
		}
		if i < len(outcomes) {
			sa.NewRevision = outcomes[i].Revision
			if outcomes[i].Err != nil {
				sa.Error = outcomes[i].Err.Error()
			}
		}
		r.Actions = append(r.Actions, sa)
	}
	return r
}

func (r syncReport) with(c *capacityReport, warnings []string) syncReport {
	r.Capacity, r.Warnings = c, warnings
	return r
}

// syncCapacity compares the schedule after plan (all is every entry, not
// only those the file manages) with what the live replicas have shown
// they can fire, and says on warn when it exceeds it, or when it could
// not be checked.
// syncJitterWarnings says, as entry put does, when entries the plan writes
// have a jitter longer than the shortest gap between two of their fires;
// many are said in one line.
func syncJitterWarnings(plan configsync.Plan, now time.Time, warn io.Writer) []string {
	var ids []string
	var first string
	for _, a := range plan.Actions {
		if a.Kind == configsync.Remove {
			continue
		}
		if ws := jitterWarnings(a.Entry, now); len(ws) > 0 {
			if first == "" {
				first = a.ID + ": " + ws[0]
			}
			ids = append(ids, a.ID)
		}
	}
	var msg string
	switch len(ids) {
	case 0:
		return nil
	case 1:
		msg = first
	default:
		msg = fmt.Sprintf("%d entries have a jitter longer than the shortest gap between two of their fires, so a tick may be delayed past the next tick's time: %s", len(ids), summarize(ids, 5))
	}
	fmt.Fprintln(warn, "cronstream: warning:", terminalSafe(msg))
	return []string{msg}
}

func syncCapacity(ctx context.Context, s *session, all []events.Current, plan configsync.Plan, warn io.Writer) (*capacityReport, []string) {
	var upserts []events.Entry
	var removes []string
	for _, a := range plan.Actions {
		switch a.Kind {
		case configsync.Create, configsync.Update:
			upserts = append(upserts, a.Entry)
		case configsync.Remove:
			removes = append(removes, a.ID)
		}
	}
	rep, warning, err := checkCapacity(ctx, s, func() ([]events.Entry, error) { return scheduleAfter(all, upserts, removes), nil }, time.Now())
	switch {
	case errors.Is(err, replica.ErrNoReplicasBucket):
		return nil, nil // no replica has run: nothing shown
	case err != nil:
		fmt.Fprintln(warn, "cronstream: capacity not checked:", terminalSafe(err.Error()))
		return nil, nil
	case warning != "":
		fmt.Fprintln(warn, "cronstream: warning:", terminalSafe(warning))
		return rep, []string{warning}
	}
	return rep, nil
}

// printPlan prints + create, ~ update (with the changed fields) and
// - remove, then the totals.
func printPlan(w io.Writer, p configsync.Plan, owner string, dryRun bool) {
	for _, a := range p.Actions {
		switch a.Kind {
		case configsync.Create:
			fmt.Fprintf(w, "%s %s  cron %q, type %s, queue %s\n", a.Kind.Sign(), terminalSafe(a.ID), a.Entry.Cron, terminalSafe(a.Entry.Task.Type), terminalSafe(a.Entry.Options.QueueName()))
		case configsync.Update:
			note := ""
			if a.Repair {
				note = "  (replaces an event that cannot be applied)"
			}
			fmt.Fprintf(w, "%s %s%s\n", a.Kind.Sign(), terminalSafe(a.ID), note)
			if !a.Repair {
				for _, c := range a.Changes {
					fmt.Fprintf(w, "    %s\n", terminalSafe(c.String()))
				}
			}
		case configsync.Remove:
			fmt.Fprintf(w, "%s %s\n", a.Kind.Sign(), terminalSafe(a.ID))
		}
	}
	c, u, r := p.Count(configsync.Create), p.Count(configsync.Update), p.Count(configsync.Remove)
	if dryRun {
		fmt.Fprintf(w, "plan: %d to create, %d to update, %d to remove, %d unchanged (dry run: nothing published)\n", c, u, r, len(p.Unchanged))
	} else {
		fmt.Fprintf(w, "sync: %d to create, %d to update, %d to remove, %d unchanged\n", c, u, r, len(p.Unchanged))
	}
	if len(p.NotPruned) > 0 {
		fmt.Fprintf(w, "not in the file but kept (owner %s; --prune removes them): %s\n", terminalSafe(owner), terminalSafe(summarize(p.NotPruned, 10)))
	}
}

func printOutcomes(w io.Writer, outcomes []configsync.Outcome) {
	for _, o := range outcomes {
		switch {
		case o.Err != nil:
			fmt.Fprintf(w, "  %s %s failed: %s\n", o.Action.Kind, terminalSafe(o.Action.ID), terminalSafe(o.Err.Error()))
		case !o.Published:
			fmt.Fprintf(w, "  %s already as wanted (revision %d)\n", terminalSafe(o.Action.ID), o.Revision)
		default:
			past := map[configsync.ActionKind]string{configsync.Create: "registered", configsync.Update: "updated", configsync.Remove: "removed"}[o.Action.Kind]
			fmt.Fprintf(w, "  %s %s at revision %d\n", terminalSafe(o.Action.ID), past, o.Revision)
		}
	}
}
