package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/schedule"
)

func init() { entryCommands = append(entryCommands, newEntryPutCommand) }

// putFlags are the fields `entry put` can set. Only the flags given on
// the command line change an existing entry.
type putFlags struct {
	conn                                 connFlags
	rev                                  revisionFlag
	cron, typ, payload, payloadFile      string
	headers                              []string
	queue, group, timezone, note         string
	maxRetry                             int
	timeout, deadline, unique, retention string
	jitter, catchup, catchupWindow       string
	overlap                              string
	replace                              bool
	pauseOnFailure, tickHeaders          bool
	payloadBytes                         []byte // --payload or --payload-file, read once
	startAt, endAt                       string
	exclude, labels                      []string
	maxFires                             string
	// now is what relative --start-at and --end-at count from: one
	// instant for the whole command, so every merge round agrees.
	now time.Time
}

// flagFields maps the entry state's fields to the flags that set them, so
// a validation error names both.
var flagFields = map[string]string{
	"id": "ID", "cron": "--cron", "timezone": "--timezone", "task.type": "--type",
	"task.payload": "--payload", "task.headers": "--header", "options.queue": "--queue",
	"options.max_retry": "--max-retry", "options.timeout": "--timeout", "options.deadline": "--deadline",
	"options.unique": "--unique", "options.retention": "--retention", "options.group": "--group",
	"catchup.policy": "--catchup", "catchup.window": "--catchup-window", "overlap": "--overlap",
	"jitter": "--jitter", "note": "--note", "start_at": "--start-at", "end_at": "--end-at",
	"exclude": "--exclude", "labels": "--label", "max_fires": "--max-fires",
}

func newEntryPutCommand(g *globalFlags) *cobra.Command {
	f := &putFlags{}
	cmd := &cobra.Command{
		Use:   "put ID",
		Short: "Register an entry, or change the fields given of an existing one",
		Long: `Register a periodic entry, or update one.

On an existing entry only the fields given on the command line change;
everything else keeps its value (--replace writes the whole entry from the
command line instead, keeping only its pause state). A put that changes
nothing publishes nothing. The entry is validated before anything is
published; each problem names its field.

--if-revision N makes the write conditional (optimistic concurrency):
it fails, naming the current revision, when someone else changed the entry
since you read revision N. --if-revision 0 only creates.

Cron specs: 5 fields, or 6 with leading seconds, descriptors (@daily,
@every 5m, aligned to the Unix epoch) and CRON_TZ=; evaluated in --timezone.
The day fields also take Quartz's and Spring's calendar forms: in the day of
the month L (the last day), L-n (n days before it), LW (the last weekday)
and nW (the weekday nearest day n, within the month); in the day of the week
dL (the last weekday d of the month, e.g. 5L or FRIL) and d#n (its n-th,
e.g. MON#1), with 0 or 7 for Sunday.

--tick-headers adds the entry id and the scheduled tick to each task as
asynq headers (cronstream-entry, cronstream-scheduled-at; a trigger adds
cronstream-trigger, a backfill cronstream-backfill), which a handler reads
with task.Headers().

--start-at and --end-at bound the ticks (both inclusive); past its end the
entry shows as ended. --exclude specs (in the entry's zone) name ticks that
are not fired but recorded as skipped with reason excluded. --label k=v
organises entries for --selector in entry ls, audit, sync and export.
--max-fires N fires at most N scheduled ticks (counted from when the limit
was last set to another value; triggers and backfills do not count), then
the entry shows as completed. An entry that uses any of these, a calendar
form or --tick-headers is written in a form replicas of earlier builds
refuse (they quarantine it rather than fire past its end, inside an
exclusion or its limit, on the wrong days or without the headers): upgrade
every replica before using them.`,
		Example: `  cronstream entry put report --cron "0 9 * * 1-5" --timezone Europe/Berlin --type report:daily \
      --payload '{"team":"ops"}' --queue reports --max-retry 5 --timeout 10m
  cronstream entry put report --queue critical           # change one field
  cronstream entry put report --if-revision 12 --cron "0 8 * * 1-5"
  cronstream entry put cleanup --cron "@every 15m" --type cleanup --overlap skip --catchup latest --catchup-window 1h
  cronstream entry put campaign --cron "0 * * * *" --type mail --start-at 2027-03-01 --end-at 2027-04-01T00:00:00Z
  cronstream entry put standup --cron "0 9 * * 1-5" --type remind --exclude "* * 25 12 *" --exclude "* * 1 1 *" \
      --label team=payments --label tier=critical
  cronstream entry put onboarding --cron "0 10 * * *" --type welcome-mail --max-fires 5
  cronstream entry put payroll --cron "0 9 LW * *" --timezone Europe/Berlin --type payroll --tick-headers
  cronstream entry put review --cron "0 14 ? * FRI#1" --type review`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEntryPut(cmd, g, f, args[0])
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cron, "cron", "", "cron spec, e.g. \"0 9 * * *\", \"*/30 * * * * *\", \"@every 10m\" (required for a new entry)")
	fl.StringVar(&f.typ, "type", "", "asynq task type (required for a new entry)")
	fl.StringVar(&f.payload, "payload", "", "task payload (its bytes)")
	fl.StringVar(&f.payloadFile, "payload-file", "", "read the task payload from this file (- for stdin)")
	fl.StringArrayVar(&f.headers, "header", nil, "task header k=v (repeatable; replaces all headers; --header '' clears them)")
	fl.StringVar(&f.queue, "queue", "", "asynq queue (default \"default\")")
	fl.IntVar(&f.maxRetry, "max-retry", events.DefaultMaxRetry, "max retries of each task")
	fl.StringVar(&f.timeout, "timeout", "", "per-attempt timeout of each task (default 30m unless --deadline)")
	fl.StringVar(&f.deadline, "deadline", "", "each task must finish this long after its scheduled time")
	fl.StringVar(&f.unique, "unique", "", "asynq unique lock TTL: skip a tick while the previous task holds the lock")
	fl.StringVar(&f.retention, "retention", "", "keep completed tasks this long")
	fl.StringVar(&f.group, "group", "", "asynq aggregation group")
	fl.StringVar(&f.timezone, "timezone", "", "IANA time zone the cron spec is evaluated in (default UTC)")
	fl.StringVar(&f.jitter, "jitter", "", "delay each tick by a deterministic amount in [0, jitter)")
	fl.StringVar(&f.catchup, "catchup", "", "missed ticks after an outage: none (default), latest or all")
	fl.StringVar(&f.catchupWindow, "catchup-window", "", "how far back catch-up looks (default 1h; at most the activity stream's max age)")
	fl.StringVar(&f.overlap, "overlap", "", "allow (default), skip a tick while the previous task is still queued or running, buffer-one: hold one such tick and fire it when that task is done, or cancel-previous: delete that task if it waits, cancel it if it runs (its handler must honour ctx cancellation), and fire the tick in its place")
	fl.StringVar(&f.note, "note", "", "free-form note")
	fl.StringVar(&f.startAt, "start-at", "", "no tick before this time: RFC 3339, a date (UTC), or relative (+2h); '' clears it")
	fl.StringVar(&f.endAt, "end-at", "", "no tick after this time (the entry then shows as ended): RFC 3339, a date (UTC), or relative (+720h); '' clears it")
	fl.StringArrayVar(&f.exclude, "exclude", nil, "cron spec in the entry's zone whose ticks are skipped (reason excluded), e.g. '* * 25 12 *' (repeatable; replaces all; --exclude '' clears them)")
	fl.StringArrayVar(&f.labels, "label", nil, "label k=v, Kubernetes rules (repeatable; replaces all labels; --label '' clears them)")
	fl.BoolVar(&f.pauseOnFailure, "pause-on-failure", false, "pause the entry when one of its tasks is archived (retries exhausted); the pause note names the task and its error (--pause-on-failure=false turns it off)")
	fl.BoolVar(&f.tickHeaders, "tick-headers", false, "add the entry id and the scheduled tick to each task as asynq headers (cronstream-entry, cronstream-scheduled-at; a trigger's and a backfill's say which they are); --header names may then not start with cronstream- (--tick-headers=false turns it off)")
	fl.StringVar(&f.maxFires, "max-fires", "", "fire at most N scheduled ticks, then show as completed (N at least 1; a new N counts afresh; '' removes the limit)")
	fl.BoolVar(&f.replace, "replace", false, "replace the whole entry with what the command line gives (keeps only the pause state)")
	addJSONResult(cmd, g)
	f.rev.add(cmd)
	addConn(cmd, &f.conn, false)
	return cmd
}

// patch applies the flags given on the command line to e. Every problem
// is reported at once, each naming its flag.
func (f *putFlags) patch(cmd *cobra.Command, e *events.Entry) error {
	p := &fieldPatch{changed: cmd.Flags().Changed}
	f.patchFields(p, e)
	f.patchDurations(p, e)
	f.patchWindow(p, e)
	if p.changed("label") {
		e.Labels = p.pairs(f.labels, func(l string) (string, string, error) {
			k, v, err := events.ParseLabel(l)
			if err != nil {
				return "", "", fmt.Errorf("--label: %w", err)
			}
			return k, v, nil
		})
	}
	if p.changed("header") {
		e.Task.Headers = p.pairs(f.headers, func(h string) (string, string, error) {
			k, v, ok := strings.Cut(h, "=")
			if !ok || k == "" {
				return "", "", fmt.Errorf("--header %q: use name=value", h)
			}
			return k, v, nil
		})
	}
	if len(p.errs) > 0 {
		return usageError{errors.Join(p.errs...)}
	}
	return nil
}

// patchFields sets the fields whose flags cannot be wrong on their own
// (Validate judges them).
func (f *putFlags) patchFields(p *fieldPatch, e *events.Entry) {
	p.str("cron", f.cron, &e.Cron)
	p.str("type", f.typ, &e.Task.Type)
	p.str("queue", f.queue, &e.Options.Queue)
	p.str("group", f.group, &e.Options.Group)
	p.str("timezone", f.timezone, &e.Timezone)
	p.str("note", f.note, &e.Note)
	if p.changed("overlap") {
		e.Overlap = events.OverlapPolicy(f.overlap)
	}
	if p.changed("pause-on-failure") {
		e.PauseOnFailure = f.pauseOnFailure
	}
	if p.changed("tick-headers") {
		e.TickHeaders = f.tickHeaders
	}
	if p.changed("catchup") {
		e.Catchup.Policy = events.CatchupPolicy(f.catchup)
	}
	if p.changed("max-retry") {
		r := f.maxRetry
		e.Options.MaxRetry = &r
	}
	if p.changed("payload") || p.changed("payload-file") {
		e.Task.Payload = f.payloadBytes
	}
	if p.changed("exclude") {
		e.Exclude = slices.DeleteFunc(slices.Clone(f.exclude), func(s string) bool { return s == "" })
	}
}

func (f *putFlags) patchDurations(p *fieldPatch, e *events.Entry) {
	p.dur("timeout", f.timeout, &e.Options.Timeout)
	p.dur("deadline", f.deadline, &e.Options.Deadline)
	p.dur("unique", f.unique, &e.Options.Unique)
	p.dur("retention", f.retention, &e.Options.Retention)
	p.dur("jitter", f.jitter, &e.Jitter)
	p.dur("catchup-window", f.catchupWindow, &e.Catchup.Window)
	if p.changed("timeout") && e.Options.Timeout == 0 && !p.changed("deadline") && e.Options.Deadline == 0 {
		// Without a deadline a zero timeout would silently become the
		// default again.
		p.errs = append(p.errs, errors.New("--timeout: 0 means no timeout, which needs a --deadline"))
	}
}

// patchWindow sets which ticks fire: --max-fires, --start-at and --end-at.
func (f *putFlags) patchWindow(p *fieldPatch, e *events.Entry) {
	if p.changed("max-fires") {
		e.MaxFires = 0
		if f.maxFires != "" {
			n, err := strconv.Atoi(strings.TrimSpace(f.maxFires))
			if err != nil || n < 1 {
				p.errs = append(p.errs, fmt.Errorf("--max-fires %q: must be a whole number of at least 1 (--max-fires '' removes the limit)", f.maxFires))
			} else {
				e.MaxFires = n
			}
		}
	}
	p.at("start-at", f.startAt, f.now, &e.StartAt)
	p.at("end-at", f.endAt, f.now, &e.EndAt)
}

// fieldPatch sets the fields whose flags were given, collecting every
// problem.
type fieldPatch struct {
	changed func(flag string) bool
	errs    []error
}

func (p *fieldPatch) str(flag, v string, dst *string) {
	if p.changed(flag) {
		*dst = v
	}
}

func (p *fieldPatch) dur(flag, v string, dst *events.Duration) {
	if !p.changed(flag) {
		return
	}
	d, err := events.ParseDuration(v)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("--%s: %w", flag, err))
		return
	}
	*dst = d
}

// at sets a time, relative ones from now; an empty value clears it.
func (p *fieldPatch) at(flag, v string, now time.Time, dst *time.Time) {
	if !p.changed(flag) {
		return
	}
	if v == "" {
		*dst = time.Time{}
		return
	}
	t, err := parseTime(flag, v, now)
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	*dst = t
}

// pairs parses a repeatable k=v flag that replaces a whole map: nil when
// it gives none (an empty value clears it).
func (p *fieldPatch) pairs(values []string, parse func(string) (k, v string, err error)) map[string]string {
	var m map[string]string
	for _, s := range values {
		if s == "" {
			continue
		}
		k, v, err := parse(s)
		if err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[k] = v
	}
	return m
}

func readPayload(cmd *cobra.Command, path string) ([]byte, error) {
	var r io.Reader = cmd.InOrStdin()
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--payload-file: %w", err)
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, events.MaxPayloadBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--payload-file: %w", err)
	}
	if len(b) > events.MaxPayloadBytes {
		return nil, fmt.Errorf("--payload-file %s: larger than %d bytes", path, events.MaxPayloadBytes)
	}
	return b, nil
}

// invalidEntryError lists every field problem, each with its flag.
func invalidEntryError(id string, err error) error {
	fes := configsync.FieldErrors(err)
	if len(fes) == 0 {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "entry %s is invalid, nothing was published:", id)
	for _, fe := range fes {
		fmt.Fprintf(&b, "\n  - %s", fe.Field)
		if flag := flagFields[fe.Field]; flag != "" {
			fmt.Fprintf(&b, " (%s)", flag)
		}
		if fe.Value != "" {
			fmt.Fprintf(&b, " %q", fe.Value)
		}
		b.WriteString(": " + fe.Reason)
	}
	// Values the user gave that cronstream refuses: a usage error (64),
	// whatever part of the entry they are in.
	return usageError{errors.New(b.String())}
}

// putResult is what `entry put --json` prints.
type putResult struct {
	ID       string       `json:"id"`
	Result   string       `json:"result"` // registered, updated or unchanged
	Revision uint64       `json:"revision"`
	Changes  []string     `json:"changes,omitempty"`
	Warnings []string     `json:"warnings,omitempty"`
	Entry    events.Entry `json:"entry"`
	// Capacity is the schedule after the put against what the live
	// replicas have shown they can fire: absent when the put did not
	// change when the entry fires, or no replica has shown it.
	Capacity *capacityReport `json:"capacity,omitempty"`
}

// maxPutRounds bounds read-merge-write rounds when other writers keep
// changing the entry between our read and our write.
const maxPutRounds = 5

func runEntryPut(cmd *cobra.Command, g *globalFlags, f *putFlags, id string) error {
	ctx := cmd.Context()
	f.now = time.Now()
	// Flags are checked before connecting: a typo costs no round trip.
	if err := f.readPayload(cmd); err != nil {
		return err
	}
	if err := f.patch(cmd, &events.Entry{}); err != nil {
		return err
	}
	s, err := openSession(g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.ensureStreams(ctx); err != nil {
		return err
	}
	userRev := cmd.Flags().Changed("if-revision")
	for round := 1; ; round++ {
		cur, rev, getErr := s.client.Get(ctx, id)
		exists, absent := getErr == nil, errors.Is(getErr, events.ErrNotFound)
		base, err := f.base(id, cur, getErr)
		if err != nil {
			return err
		}
		next := base.Clone()
		if err := f.patch(cmd, &next); err != nil {
			return err
		}
		next.ID, next.Removed = id, false
		if err := next.Validate(); err != nil {
			return invalidEntryError(id, err)
		}
		if err := s.checkCatchup(ctx, next); err != nil {
			return err
		}
		opts := f.rev.opts(cmd)
		if !userRev && (exists || absent) {
			// Merge is read-modify-write: guard it with the revision read.
			opts = []events.WriteOption{events.IfRevision(rev)}
		}
		res, err := s.client.Put(ctx, next, opts...)
		if errors.Is(err, events.ErrRevisionConflict) && !userRev && round < maxPutRounds {
			continue // changed between our read and write: merge again
		}
		if err != nil {
			if fes := configsync.FieldErrors(err); len(fes) > 0 {
				return invalidEntryError(id, err)
			}
			return err
		}
		out := f.result(ctx, cmd, s, id, res, cur, exists)
		if g.json {
			return printJSON(cmd.OutOrStdout(), out)
		}
		printPutResult(cmd.OutOrStdout(), out)
		return nil
	}
}

// readPayload reads --payload or --payload-file, once.
func (f *putFlags) readPayload(cmd *cobra.Command) error {
	switch {
	case cmd.Flags().Changed("payload") && cmd.Flags().Changed("payload-file"):
		return errors.New("--payload and --payload-file: give one of them")
	case cmd.Flags().Changed("payload"):
		f.payloadBytes = []byte(f.payload)
	case cmd.Flags().Changed("payload-file"):
		b, err := readPayload(cmd, f.payloadFile)
		if err != nil {
			return err
		}
		f.payloadBytes = b
	}
	return nil
}

// base is the entry the flags are applied to: the current one (cur, or
// getErr why not), or with --replace only its pause state.
func (f *putFlags) base(id string, cur events.Entry, getErr error) (events.Entry, error) {
	switch {
	case getErr == nil && f.replace:
		base := events.Entry{ID: id, Paused: cur.Paused}
		if cur.Paused {
			base.Note = cur.Note
		}
		return base, nil
	case getErr == nil:
		return cur, nil
	case errors.Is(getErr, events.ErrNotFound):
		return events.Entry{ID: id}, nil
	case errors.Is(getErr, events.ErrMalformedEvent) && f.replace:
		// The last event cannot be applied: write the entry anew. Its
		// revision is unknown here, so only --if-revision guards it.
		return events.Entry{ID: id}, nil
	case errors.Is(getErr, events.ErrMalformedEvent):
		return events.Entry{}, fmt.Errorf("%w\nthe entry's current state cannot be read, so fields cannot be kept: write it whole with --replace", getErr)
	}
	return events.Entry{}, getErr
}

// result says what the put did (cur is the entry before it, when it
// existed), checks the capacity when it changed when the entry fires, and
// says the warnings on stderr.
func (f *putFlags) result(ctx context.Context, cmd *cobra.Command, s *session, id string, res events.Result, cur events.Entry, exists bool) putResult {
	out := putResult{ID: id, Revision: res.Revision, Entry: res.Entry, Warnings: jitterWarnings(res.Entry, f.now)}
	switch events.ConfigKind(res.Type) {
	case events.TypeEntryRegistered:
		out.Result = "registered"
	case events.TypeEntryUpdated:
		out.Result = "updated"
		if exists {
			for _, c := range configsync.Diff(cur, res.Entry) {
				out.Changes = append(out.Changes, c.String())
			}
		}
	default:
		out.Result = "unchanged"
	}
	if out.Result == "registered" || (out.Result == "updated" && exists && scheduleChanged(cur, res.Entry)) {
		out.Capacity = putCapacity(ctx, s, res.Entry, &out.Warnings, cmd.ErrOrStderr())
	}
	for _, warning := range out.Warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "cronstream: warning:", terminalSafe(warning))
	}
	return out
}

func printPutResult(w io.Writer, out putResult) {
	if out.Result == "unchanged" {
		fmt.Fprintf(w, "entry %s unchanged at revision %d (nothing published)\n", out.ID, out.Revision)
		return
	}
	fmt.Fprintf(w, "entry %s %s at revision %d\n", out.ID, out.Result, out.Revision)
	for _, c := range out.Changes {
		fmt.Fprintf(w, "  %s\n", terminalSafe(c))
	}
}

// putCapacity compares the schedule with e as put with what the live
// replicas have shown they can fire, adding a warning to warnings when it
// exceeds it; a check that cannot be made is said on warn.
func putCapacity(ctx context.Context, s *session, e events.Entry, warnings *[]string, warn io.Writer) *capacityReport {
	rep, warning, err := checkCapacity(ctx, s, func() ([]events.Entry, error) {
		cur, err := s.client.List(ctx)
		if err != nil {
			return nil, err
		}
		return scheduleAfter(cur, []events.Entry{e}, nil), nil
	}, time.Now())
	switch {
	case errors.Is(err, replica.ErrNoReplicasBucket):
	case err != nil:
		fmt.Fprintln(warn, "cronstream: capacity not checked:", terminalSafe(err.Error()))
	case warning != "":
		*warnings = append(*warnings, warning)
	}
	return rep
}

// jitterWarnings says when e's jitter is longer than the shortest gap
// between two of its fires: a tick could then be delayed past the next
// one's time, which is rarely what was meant.
func jitterWarnings(e events.Entry, now time.Time) []string {
	if e.Jitter <= 0 {
		return nil
	}
	s, err := schedule.NewSchedule(e)
	if err != nil {
		return nil
	}
	gap := s.ShortestGap(now)
	if gap <= 0 || e.Jitter.D() <= gap {
		return nil
	}
	return []string{fmt.Sprintf("jitter %s is longer than the %s between two fires of %q: a tick may be delayed past the next tick's time (a jitter of at most %s keeps each fire before the next tick)",
		e.Jitter, events.Duration(gap), e.Cron, events.Duration(gap))}
}
