package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/audit"
	"github.com/cronstream/cronstream/events"
)

func init() { subcommands = append(subcommands, newAuditCommand) }

type auditFlags struct {
	conn         connFlags
	entry, queue string
	typ          string
	since, until string
	follow       bool
	exitOnLost   bool
	output       outputFlag
	limit, tail  int
	selector     string
}

func newAuditCommand(g *globalFlags) *cobra.Command {
	f := &auditFlags{}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read the audit log: config changes, fires and recoveries in time order",
		Long: `Print the events of both streams, <PREFIX>_CONFIG (every config change)
and <PREFIX>_ACTIVITY (fires, skips, recoveries), merged in the order the
streams stored them.

Filters combine:
  --entry ID     config events of the entry and its fired/skipped events
  --selector S   config, fired and skipped events of entries whose labels
                 match S (team=payments, tier!=batch, team, !team)
  --queue Q      recoveries in queue Q, fires into Q, and config events of
                 entries that are in Q (or just left it)
  --type T,...   event types: short names (fired), with or without the
                 "cronstream." prefix (entry.fired), or globs ('task.*',
                 'entry.*'); several separated by commas
  --since/--until TIME   RFC 3339, a date (UTC), or a time ago: 1h, 24h,
                 7d, 30m (-1h means the same)
  --limit N      only the first N events;  --tail N  only the last N

Event types (short name, full name, stream):
` + auditTypesHelp() + `
--follow keeps printing new events after the history until interrupted
(with --tail: the last N, then new ones; with --limit: until N printed).
While following, a NATS or JetStream that stops answering is said on
stderr within 5 s, and again when it is back; the follow then carries on
from where it stopped. --exit-on-disconnect exits with status 5 instead.

--json prints one JSON object per line (ndjson): the CloudEvent as stored,
with "stream" (the stream's name) and "seq" (its stream sequence) added:
  {"specversion":"1.0","id":"fire:report:1741770000",
   "source":"cronstream/replica-1","type":"cronstream.entry.fired",
   "subject":"report","time":"2025-03-12T09:00:00.012345Z",
   "datacontenttype":"application/json",
   "data":{"entry":"report","scheduled_at":"…","enqueued_at":"…",
           "task_id":"…","queue":"default","revision":12,"replica":"…"},
   "stream":"CRONSTREAM_ACTIVITY","seq":4711}
(one line each; "data" is the type's payload, see docs/design.md). A
message the relay published before Redis's replicas confirmed its write
also has "redis_unconfirmed" (e.g. "0/1 timeout"; text output marks it
too). A stored
message that is not a JSON object is shown as {"stream","seq",
"nats_subject","malformed"}. Event types this version does not know are
shown as they are.`,
		Example: `  cronstream audit --since 1h
  cronstream audit --entry report --follow
  cronstream audit --type fired,skipped --since 7d --tail 20
  cronstream audit --queue critical --type 'task.*' --since 2025-03-01
  cronstream audit --json --since 24h | jq 'select(.type=="cronstream.entry.skipped")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAudit(cmd, g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.entry, "entry", "", "only events of this entry")
	fl.StringVar(&f.queue, "queue", "", "only events concerning this asynq queue")
	addSelector(cmd, &f.selector, "only events of entries whose labels match", "")
	fl.StringVar(&f.typ, "type", "", "only these event types: short names (fired), full names or globs, comma separated")
	fl.StringVar(&f.since, "since", "", "only events stored at or after this time (RFC 3339, a date, or ago: 1h, 7d)")
	fl.StringVar(&f.until, "until", "", "only events stored at or before this time (RFC 3339, a date, or ago: 1h, 7d)")
	fl.IntVar(&f.limit, "limit", 0, "print only the first N events")
	fl.IntVar(&f.tail, "tail", 0, "print only the last N events of the history")
	fl.BoolVar(&f.follow, "follow", false, "keep printing new events until interrupted")
	fl.BoolVar(&f.exitOnLost, "exit-on-disconnect", false, "with --follow: exit with status 5 when NATS stops answering, instead of waiting for it")
	addOutput(cmd, &f.output, outTable, outWide, outJSON, outYAML, outName)
	addConn(cmd, &f.conn, false)
	return cmd
}

func runAudit(cmd *cobra.Command, g *globalFlags, f *auditFlags) error {
	ctx := cmd.Context()
	format, err := f.output.resolve(cmd)
	if err != nil {
		return err
	}
	params, err := f.params(time.Now())
	if err != nil {
		return err
	}
	f.conn.reconnectForever = f.follow
	s, err := openStreamsSession(ctx, g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()
	if f.entry != "" {
		if err := requireConfigEvent(ctx, s, f.entry); err != nil {
			return err
		}
	}
	lost := func() error { return nil }
	if f.follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		var stop func()
		lost, stop = watchNATS(ctx, cancel, s, cmd.ErrOrStderr(), f.exitOnLost)
		defer stop()
	}

	prog := newProgress(os.Stderr, isTerminal(os.Stdout))
	defer prog.clear()
	params.Names, params.Progress = s.names, prog.update
	r, err := audit.Open(ctx, s.js, params)
	if err != nil {
		return err
	}
	defer r.Close()
	out := &auditPrinter{w: cmd.OutOrStdout(), format: format, times: timesFor(cmd.OutOrStdout())}
	history := true
	for {
		rec, err := r.Next(ctx)
		switch {
		case ctx.Err() != nil:
			if cmd.Context().Err() == nil {
				return lost() // the watch ended the follow
			}
			return nil
		case errors.Is(err, io.EOF):
			// The end of the history; following, what comes next is live
			// (another io.EOF: --limit reached).
			prog.clear()
			if !f.follow || !history {
				return nil
			}
			history = false
			continue
		case err != nil:
			return err
		}
		prog.beforeOutput()
		if err := out.print(rec); err != nil {
			return err
		}
	}
}

// params checks the filters, before anything is connected, and turns them
// into the reader's parameters (but Names and Progress).
func (f *auditFlags) params(now time.Time) (audit.Params, error) {
	var since, until time.Time
	var err error
	if f.since != "" {
		if since, err = parseAgo("since", f.since, now); err != nil {
			return audit.Params{}, usageError{err}
		}
	}
	if f.until != "" {
		if until, err = parseAgo("until", f.until, now); err != nil {
			return audit.Params{}, usageError{err}
		}
		if f.follow {
			return audit.Params{}, usagef("--follow and --until: following never ends at a time; drop one")
		}
		if !since.IsZero() && until.Before(since) {
			return audit.Params{}, usagef("--until %s is before --since %s", fmtTime(until), fmtTime(since))
		}
	}
	var globs []string
	if f.typ != "" {
		if globs, err = typeGlobs(f.typ); err != nil {
			return audit.Params{}, usageError{err}
		}
	}
	switch {
	case f.limit < 0 || f.tail < 0:
		return audit.Params{}, usagef("--limit and --tail count events: give a positive number")
	case f.limit > 0 && f.tail > 0:
		return audit.Params{}, usagef("--limit and --tail: give one (the first N or the last N)")
	}
	if f.entry != "" {
		if err := events.ValidateID(f.entry); err != nil {
			return audit.Params{}, usageError{fmt.Errorf("--entry: %w", err)}
		}
	}
	sel, err := parseSelector(f.selector)
	if err != nil {
		return audit.Params{}, err
	}
	if f.exitOnLost && !f.follow {
		return audit.Params{}, usagef("--exit-on-disconnect applies to --follow only")
	}
	return audit.Params{Entry: f.entry, Queue: f.queue, Selector: sel, Types: globs, Since: since, Until: until,
		Limit: f.limit, Tail: f.tail, Follow: f.follow}, nil
}

// requireConfigEvent refuses an entry that never had a config event: a
// typo more often than an empty history, as describe says.
func requireConfigEvent(ctx context.Context, s *session, id string) error {
	stream, err := s.js.Stream(ctx, s.names.ConfigStream())
	if err != nil {
		return fmt.Errorf("look up entry %s: %w", id, err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, s.names.ConfigSubject(id)); errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("entry %s: %w: it never had a config event", id, events.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("look up entry %s: %w", id, err)
	}
	return nil
}

// typeGlobs splits --type at commas and checks each part (audit.CheckType):
// a pattern that matches none of cronstream's event types is refused with
// the list of types, rather than silently matching nothing, unless it names
// another namespace (com.example.*: events this version does not know).
func typeGlobs(s string) ([]string, error) {
	var out []string
	for _, g := range strings.Split(s, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		if err := audit.CheckType(g); errors.Is(err, audit.ErrUnknownType) {
			return nil, fmt.Errorf("--type %q matches no event type; the types are:\n%s", g, auditTypesHelp())
		} else if err != nil {
			return nil, fmt.Errorf("--type %q: %w", g, err)
		}
		out = append(out, g)
	}
	return out, nil
}

// auditTypesHelp lists the event types, one per line.
func auditTypesHelp() string {
	var b strings.Builder
	for _, ti := range events.Types {
		fmt.Fprintf(&b, "  %-11s %-33s %-9s %s\n", events.ShortType(ti.Type), ti.Type, ti.Stream, ti.Doc)
	}
	return b.String()
}

// parseAgo is parseTime where a duration without a sign means that long
// ago (--since 1h: an hour ago), and durations take days (7d).
func parseAgo(flag, s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	sign := ""
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		sign, s = s[:1], s[1:]
	}
	if d, ok := durationWithDays(s); ok {
		if sign == "+" {
			return now.Add(d), nil
		}
		return now.Add(-d), nil
	}
	return parseTime(flag, sign+s, now)
}

// durationWithDays parses a Go duration that may start with whole days
// ("7d", "1d12h").
func durationWithDays(s string) (time.Duration, bool) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100*366 {
			return 0, false
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, true
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, false
	}
	return days + d, true
}

// auditPrinter writes one line per event.
type auditPrinter struct {
	w      io.Writer
	format string // -o: table, wide, json (one event a line), yaml (a document each), name
	times  timeText
}

func (p *auditPrinter) print(rec audit.Record) error {
	switch p.format {
	case outJSON, outYAML:
		line, err := withStreamSeq(rec)
		if err != nil {
			return err
		}
		if p.format == outJSON {
			_, err = p.w.Write(append(line, '\n'))
			return err
		}
		fmt.Fprintln(p.w, "---")
		return printYAML(p.w, json.RawMessage(line))
	case outName:
		if rec.Event == nil {
			return nil
		}
		_, err := fmt.Fprintf(p.w, "%s%s\n", eventNamePrefix, terminalSafe(rec.Event.ID))
		return err
	}
	ev := rec.Event
	ts := rec.Time.UTC().Format("2006-01-02T15:04:05.000Z")
	if p.times.relative {
		ts = fmt.Sprintf("%s %-10s", ts, "("+relTime(rec.Time, p.times.now)+")")
	}
	if rec.Refused != nil && (rec.Err != nil || !rec.FailPause) {
		_, werr := fmt.Fprintf(p.w, "%s  %-22s  %-24s  %s (%s seq %d)\n", ts, "(skipped)", terminalSafe(rec.Subject), terminalSafe(shorten(rec.Refused.Error(), 100)), rec.Stream, rec.Seq)
		return werr
	}
	if rec.Err != nil {
		_, werr := fmt.Fprintf(p.w, "%s  %-22s  %-24s  %s (%s seq %d)\n", ts, "(malformed)", terminalSafe(rec.Subject), terminalSafe(shorten(rec.Err.Error(), 100)), rec.Stream, rec.Seq)
		return werr
	}
	subject := ev.Subject
	if subject == "" {
		subject = rec.Subject
	}
	summary := eventSummary(ev)
	if rec.Unconfirmed != "" {
		summary += " [published before Redis replicas confirmed it: " + rec.Unconfirmed + "]"
	}
	switch {
	case rec.FailPause && rec.Refused != nil:
		summary = "REFUSED fail-pause request (changed nothing): " + shorten(rec.Refused.Error(), 100) + "; " + summary
	case rec.FailPause:
		summary = "on failure, by " + ev.Source + ": " + summary
	}
	if p.format == outWide {
		summary += fmt.Sprintf("  (%s seq %d, id %s, source %s)", rec.Stream, rec.Seq, ev.ID, ev.Source)
	}
	_, werr := fmt.Fprintf(p.w, "%s  %-22s  %-24s  %s\n", ts, terminalSafe(events.DisplayType(ev.Type)), terminalSafe(subject), terminalSafe(summary))
	return werr
}

// withStreamSeq returns the stored CloudEvent, compacted to one line, with
// "stream" and "seq" added. A message that is not a JSON object is wrapped
// so the output stays one JSON value per line.
func withStreamSeq(rec audit.Record) ([]byte, error) {
	var buf bytes.Buffer
	extra := fmt.Sprintf(`"stream":%q,"seq":%d`, rec.Stream, rec.Seq)
	if rec.Unconfirmed != "" {
		u, err := json.Marshal(rec.Unconfirmed)
		if err != nil {
			return nil, err
		}
		extra += `,"redis_unconfirmed":` + string(u)
	}
	if rec.FailPause {
		extra += `,"fail_pause":true`
	}
	if rec.Refused != nil {
		refused, _ := json.Marshal(rec.Refused.Error())
		extra += `,"refused":` + string(refused)
	}
	if json.Compact(&buf, rec.Data) == nil && bytes.HasPrefix(buf.Bytes(), []byte("{")) {
		b := bytes.TrimSuffix(buf.Bytes(), []byte("}"))
		if bytes.Equal(b, []byte("{")) {
			return []byte("{" + extra + "}"), nil
		}
		return append(append(b, ','), []byte(extra+"}")...), nil
	}
	return json.Marshal(map[string]any{"stream": rec.Stream, "seq": rec.Seq, "nats_subject": rec.Subject, "malformed": string(rec.Data)})
}

// eventSummary says what an event is about in a few words.
func eventSummary(ev *events.Event) string {
	switch events.ConfigKind(ev.Type) {
	case events.TypeEntryRegistered, events.TypeEntryUpdated:
		var e events.Entry
		if ev.DecodeData(&e) == nil {
			return fmt.Sprintf("cron %q type %s queue %s", e.Cron, e.Task.Type, e.Options.QueueName())
		}
	case events.TypeEntryPaused:
		var e events.Entry
		if ev.DecodeData(&e) == nil && e.Note != "" {
			return fmt.Sprintf("note %q", e.Note)
		}
		return ""
	case events.TypeEntryResumed, events.TypeEntryRemoved:
		return "by " + ev.Source
	case events.TypeEntryFired:
		var d events.Fired
		if ev.DecodeData(&d) == nil {
			s := fmt.Sprintf("task %s queue %s scheduled %s", d.TaskID, d.Queue, fmtTime(d.ScheduledAt))
			switch {
			case d.Trigger != "":
				s += " (trigger " + d.Trigger + ")"
			case d.Backfill:
				s += " (backfill)"
			}
			return s
		}
	case events.TypeEntrySkipped:
		var d events.Skipped
		if ev.DecodeData(&d) == nil {
			s := fmt.Sprintf("%s: scheduled %s", d.Reason, fmtTime(d.ScheduledAt))
			if d.Until != nil {
				s += fmt.Sprintf(" to %s (%d ticks)", fmtTime(*d.Until), d.Count)
			}
			return s
		}
	case events.TypeTaskRetried, events.TypeTaskArchived:
		var d events.TaskRecovered
		if ev.DecodeData(&d) == nil {
			s := fmt.Sprintf("task %s queue %s type %s retried %d/%d", d.TaskID, d.Queue, d.Type, d.Retried, d.MaxRetry)
			if d.RetryAt != nil {
				s += " next " + fmtTime(*d.RetryAt)
			}
			return s + fmt.Sprintf(" error %q", shorten(d.Error, 60))
		}
	case events.TypeAggregationReclaimed:
		var d events.AggregationReclaimed
		if ev.DecodeData(&d) == nil {
			return fmt.Sprintf("queue %s group %s set %s: %d tasks back in the group", d.Queue, d.Group, d.Set, d.Tasks)
		}
	case events.TypeTaskCancelled:
		var d events.TaskCancelled
		if ev.DecodeData(&d) == nil {
			return fmt.Sprintf("task %s queue %s was %s: %s, replaced by %s scheduled %s", d.TaskID, d.Queue, d.State, d.Action, d.ReplacedBy, fmtTime(d.ScheduledAt))
		}
	case events.TypeTaskLost:
		var d events.TasksLost
		if ev.DecodeData(&d) == nil {
			return d.Summary()
		}
	}
	var buf bytes.Buffer
	if json.Compact(&buf, ev.Data) == nil {
		return shorten(buf.String(), 120)
	}
	return shorten(string(ev.Data), 120)
}

func shorten(s string, max int) string {
	r := []rune(s)
	if len(r) <= max {
		return s
	}
	return string(r[:max]) + "…"
}

// progress shows how far a long history read is, on a terminal only, and
// only once the read has taken more than a second.
type progress struct {
	w        *os.File
	on       bool
	total    uint64
	n        uint64
	start    time.Time
	last     time.Time
	shown    bool
	outIsTTY bool
}

func newProgress(w *os.File, stdoutIsTTY bool) *progress {
	return &progress{w: w, on: isTerminal(w), start: time.Now(), outIsTTY: stdoutIsTTY}
}

// update is audit.Params.Progress: read of the history's total messages
// are read.
func (p *progress) update(read, total uint64) {
	p.n, p.total = read, total
	if !p.on || total == 0 {
		return
	}
	now := time.Now()
	if now.Sub(p.start) < time.Second || now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	p.shown = true
	fmt.Fprintf(p.w, "\rreading audit log: %d/%d events (%d%%)", p.n, p.total, p.n*100/max(p.total, 1))
}

// beforeOutput removes the progress line before a line is written to the
// same terminal; it is redrawn at the next step.
func (p *progress) beforeOutput() {
	if p.outIsTTY {
		p.clear()
	}
}

// clear removes the progress line.
func (p *progress) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}
