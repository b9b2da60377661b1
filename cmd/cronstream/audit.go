package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

func init() { subcommands = append(subcommands, newAuditCommand) }

type auditFlags struct {
	conn         connFlags
	entry, queue string
	typ          string
	since, until string
	follow       bool
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

--json prints one JSON object per line (ndjson): the CloudEvent as stored,
with "stream" (the stream's name) and "seq" (its stream sequence) added:
  {"specversion":"1.0","id":"fire:report:1741770000",
   "source":"cronstream/replica-1","type":"cronstream.entry.fired",
   "subject":"report","time":"2025-03-12T09:00:00.012345Z",
   "datacontenttype":"application/json",
   "data":{"entry":"report","scheduled_at":"…","enqueued_at":"…",
           "task_id":"…","queue":"default","revision":12,"replica":"…"},
   "stream":"CRONSTREAM_ACTIVITY","seq":4711}
(one line each; "data" is the type's payload, see docs/design.md). A stored
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
	fl.StringVarP(&f.selector, "selector", "l", "", "only events of entries whose labels match (k=v, k!=v, k, !k; commas join)")
	fl.StringVar(&f.typ, "type", "", "only these event types: short names (fired), full names or globs, comma separated")
	fl.StringVar(&f.since, "since", "", "only events stored at or after this time (RFC 3339, a date, or ago: 1h, 7d)")
	fl.StringVar(&f.until, "until", "", "only events stored at or before this time (RFC 3339, a date, or ago: 1h, 7d)")
	fl.IntVar(&f.limit, "limit", 0, "print only the first N events")
	fl.IntVar(&f.tail, "tail", 0, "print only the last N events of the history")
	fl.BoolVar(&f.follow, "follow", false, "keep printing new events until interrupted")
	fl.BoolVar(&g.json, "json", false, "one CloudEvent per line, with stream and seq")
	addConn(cmd, &f.conn, false)
	return cmd
}

// auditMsg is one stored message of either stream.
type auditMsg struct {
	stream  string
	config  bool
	seq     uint64
	time    time.Time
	subject string
	data    []byte
}

// auditSource reads one stream through an ordered consumer, in a
// goroutine that hands each message to ch.
type auditSource struct {
	config  bool
	stream  string
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	ch      chan auditMsg
	pending uint64 // messages of the history still to read
	head    *auditMsg
	done    bool // history read (or --until passed)
}

func runAudit(cmd *cobra.Command, g *globalFlags, f *auditFlags) error {
	ctx := cmd.Context()
	now := time.Now()
	var since, until time.Time
	var err error
	if f.since != "" {
		if since, err = parseAgo("since", f.since, now); err != nil {
			return usageError{err}
		}
	}
	if f.until != "" {
		if until, err = parseAgo("until", f.until, now); err != nil {
			return usageError{err}
		}
		if f.follow {
			return usagef("--follow and --until: following never ends at a time; drop one")
		}
		if !since.IsZero() && until.Before(since) {
			return usagef("--until %s is before --since %s", fmtTime(until), fmtTime(since))
		}
	}
	var globs []string
	if f.typ != "" {
		if globs, err = typeGlobs(f.typ); err != nil {
			return usageError{err}
		}
	}
	switch {
	case f.limit < 0 || f.tail < 0:
		return usagef("--limit and --tail count events: give a positive number")
	case f.limit > 0 && f.tail > 0:
		return usagef("--limit and --tail: give one (the first N or the last N)")
	}
	if f.entry != "" {
		if err := events.ValidateID(f.entry); err != nil {
			return usageError{fmt.Errorf("--entry: %w", err)}
		}
	}
	sel, err := events.ParseSelector(f.selector)
	if err != nil {
		return usagef("--selector: %v", err)
	}
	s, err := openStreamsSession(ctx, g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()

	flt := &auditFilter{names: s.names, entry: f.entry, queue: f.queue, globs: globs, since: since, until: until, queueOf: map[string]string{},
		sel: sel, labelsOf: map[string]map[string]string{}}
	// With --queue, the config stream is read from its start whatever
	// --since says: the entry → queue map must be known at --since to tell
	// which fire and skip events concern the queue. Events before --since
	// only feed the map.
	cfgSubjects := []string{s.names.ConfigFilter()}
	actSubjects := []string(nil)
	switch {
	case f.entry != "":
		cfgSubjects = []string{s.names.ConfigSubject(f.entry)}
		actSubjects = []string{s.names.FireSubject(f.entry)}
	case f.queue != "":
		actSubjects = []string{s.names.Prefix() + ".fire.>", s.names.RecoverySubject(f.queue)}
	case !sel.Empty():
		actSubjects = []string{s.names.Prefix() + ".fire.>"}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var sources []*auditSource
	defer func() {
		cancel()
		for _, src := range sources {
			if src.it != nil {
				src.it.Stop()
			}
		}
		wg.Wait()
		for _, src := range sources {
			if info := src.cons.CachedInfo(); info != nil {
				dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = s.js.DeleteConsumer(dctx, src.stream, info.Name)
				dcancel()
			}
		}
	}()
	for _, spec := range []struct {
		config   bool
		stream   string
		subjects []string
		since    time.Time
	}{
		{true, s.names.ConfigStream(), cfgSubjects, pick2(f.queue != "" || !sel.Empty(), time.Time{}, since)},
		{false, s.names.ActivityStream(), actSubjects, since},
	} {
		cc := jetstream.OrderedConsumerConfig{FilterSubjects: spec.subjects, InactiveThreshold: time.Minute}
		if !spec.since.IsZero() {
			t := spec.since
			cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
		}
		cons, err := s.js.OrderedConsumer(ctx, spec.stream, cc)
		if err != nil {
			return fmt.Errorf("read %s: %w", spec.stream, err)
		}
		src := &auditSource{config: spec.config, stream: spec.stream, cons: cons, ch: make(chan auditMsg, 256)}
		sources = append(sources, src)
		if info := cons.CachedInfo(); info != nil {
			src.pending = info.NumPending
		}
		src.done = src.pending == 0
		if src.done && !f.follow {
			continue
		}
		if src.it, err = cons.Messages(); err != nil {
			return fmt.Errorf("read %s: %w", spec.stream, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			src.read(rctx)
		}()
	}

	out := &auditPrinter{w: cmd.OutOrStdout(), json: g.json, names: s.names, limit: f.limit}
	var tail []auditMsg // the last --tail kept messages of the history
	prog := newProgress(os.Stderr, sources[0].pending+sources[1].pending, isTerminal(os.Stdout))
	defer prog.clear()

	// History: a two-way merge by stream timestamp.
	for {
		for _, src := range sources {
			for !src.done && src.head == nil {
				select {
				case m := <-src.ch:
					src.pending--
					if !until.IsZero() && m.time.After(until) {
						src.done = true
						break
					}
					src.head = &m
					if src.pending == 0 {
						// The last message of the history is this head.
						src.done = true
					}
				case <-ctx.Done():
					return nil
				}
			}
		}
		var next *auditSource
		for _, src := range sources {
			if src.head != nil && (next == nil || src.head.time.Before(next.head.time)) {
				next = src
			}
		}
		if next == nil {
			break
		}
		m := *next.head
		next.head = nil
		if flt.keep(m) {
			if f.tail > 0 {
				if len(tail) == f.tail {
					tail = append(tail[:0], tail[1:]...)
				}
				tail = append(tail, m)
			} else {
				prog.beforeOutput()
				if err := out.print(m); err != nil {
					return err
				}
				if out.full() {
					return nil
				}
			}
		}
		prog.step()
	}
	prog.clear()
	for _, m := range tail {
		if err := out.print(m); err != nil {
			return err
		}
	}
	if !f.follow {
		return nil
	}
	// Live: whatever either stream stores next, as it arrives.
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-sources[0].ch:
			if flt.keep(m) {
				if err := out.print(m); err != nil || out.full() {
					return err
				}
			}
		case m := <-sources[1].ch:
			if flt.keep(m) {
				if err := out.print(m); err != nil || out.full() {
					return err
				}
			}
		}
	}
}

func pick2(cond bool, a, b time.Time) time.Time {
	if cond {
		return a
	}
	return b
}

// read hands every message to ch until ctx ends or the iterator stops.
func (src *auditSource) read(ctx context.Context) {
	for {
		m, err := src.it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			continue // the ordered consumer recreates itself after a gap or reconnect
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		am := auditMsg{stream: src.stream, config: src.config, seq: md.Sequence.Stream, time: md.Timestamp, subject: m.Subject(), data: m.Data()}
		select {
		case src.ch <- am:
		case <-ctx.Done():
			return
		}
	}
}

// auditFilter decides which messages are shown.
type auditFilter struct {
	names        events.Names
	entry, queue string
	globs        []string // of typeGlobs; empty: every type
	since, until time.Time
	// queueOf follows each entry's queue through the config events, so
	// skipped events (which carry no queue) can be matched to --queue.
	queueOf map[string]string
	// sel is --selector; labelsOf follows each entry's labels the same
	// way (see selected).
	sel      events.Selector
	labelsOf map[string]map[string]string
}

func (f *auditFilter) keep(m auditMsg) bool {
	ev, decErr := events.DecodeEvent(m.data)
	inQueue := f.queue == ""
	if f.queue != "" {
		inQueue = f.concernsQueue(m, ev)
	}
	if !f.sel.Empty() && !f.selected(m) {
		return false
	}
	if !f.since.IsZero() && m.time.Before(f.since) {
		return false
	}
	if !f.until.IsZero() && m.time.After(f.until) {
		return false
	}
	if !inQueue {
		return false
	}
	if len(f.globs) > 0 && (decErr != nil || !typeMatches(f.globs, ev.Type)) {
		return false
	}
	return true
}

// typeMatches reports whether an event type matches one of globs, by its
// full name, its name without "cronstream." or its short name.
func typeMatches(globs []string, typ string) bool {
	for _, g := range globs {
		kind := events.ConfigKind(typ) // a gated config event matches its kind
		for _, name := range []string{typ, strings.TrimPrefix(typ, "cronstream."), events.ShortType(typ), kind, strings.TrimPrefix(kind, "cronstream.")} {
			if ok, _ := path.Match(g, name); ok {
				return true
			}
		}
	}
	return false
}

// typeGlobs splits --type at commas and checks each part: a pattern that
// matches none of cronstream's event types is refused with the list of
// types, rather than silently matching nothing, unless it names another
// namespace (com.example.*: events this version does not know).
func typeGlobs(s string) ([]string, error) {
	var out []string
	for _, g := range strings.Split(s, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		if _, err := path.Match(g, ""); err != nil {
			return nil, fmt.Errorf("--type %q: %w", g, err)
		}
		known := false
		ours := map[string]bool{"cronstream": true}
		for _, ti := range events.Types {
			known = known || typeMatches([]string{g}, ti.Type)
			ours[strings.Split(ti.Type, ".")[1]] = true
		}
		first, _, dotted := strings.Cut(g, ".")
		if !known && (!dotted || ours[first]) {
			return nil, fmt.Errorf("--type %q matches no event type; the types are:\n%s", g, auditTypesHelp())
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

// concernsQueue also keeps queueOf up to date, so it must see every
// message in order.
func (f *auditFilter) concernsQueue(m auditMsg, ev *events.Event) bool {
	if m.config {
		id, ok := f.names.EntryFromConfigSubject(m.subject)
		if !ok {
			return false
		}
		prev := f.queueOf[id]
		_, e, err := events.DecodeConfigEvent(m.data)
		if err != nil || e == nil {
			return prev == f.queue
		}
		q := e.Options.QueueName()
		if e.Removed {
			delete(f.queueOf, id)
		} else {
			f.queueOf[id] = q
		}
		return q == f.queue || prev == f.queue
	}
	if q, ok := f.names.QueueFromRecoverySubject(m.subject); ok {
		return q == f.queue
	}
	id, ok := f.names.EntryFromFireSubject(m.subject)
	if !ok {
		return false
	}
	if ev != nil && ev.Type == events.TypeEntryFired {
		var fd events.Fired
		if ev.DecodeData(&fd) == nil && fd.Queue != "" {
			return fd.Queue == f.queue
		}
	}
	return f.queueOf[id] == f.queue
}

// auditPrinter writes one line per event, up to limit (0: no limit).
type auditPrinter struct {
	w       io.Writer
	json    bool
	names   events.Names
	limit   int
	printed int
}

// full reports whether --limit events have been printed.
func (p *auditPrinter) full() bool { return p.limit > 0 && p.printed >= p.limit }

func (p *auditPrinter) print(m auditMsg) error {
	p.printed++
	if p.json {
		line, err := withStreamSeq(m)
		if err != nil {
			return err
		}
		_, err = p.w.Write(append(line, '\n'))
		return err
	}
	ev, err := events.DecodeEvent(m.data)
	ts := m.time.UTC().Format("2006-01-02T15:04:05.000Z")
	if err != nil {
		_, werr := fmt.Fprintf(p.w, "%s  %-22s  %-24s  %s (%s seq %d)\n", ts, "(malformed)", terminalSafe(m.subject), terminalSafe(shorten(err.Error(), 100)), m.stream, m.seq)
		return werr
	}
	subject := ev.Subject
	if subject == "" {
		subject = m.subject
	}
	_, werr := fmt.Fprintf(p.w, "%s  %-22s  %-24s  %s\n", ts, terminalSafe(shortType(ev.Type)), terminalSafe(subject), terminalSafe(eventSummary(ev)))
	return werr
}

// withStreamSeq returns the stored CloudEvent, compacted to one line, with
// "stream" and "seq" added. A message that is not a JSON object is wrapped
// so the output stays one JSON value per line.
func withStreamSeq(m auditMsg) ([]byte, error) {
	var buf bytes.Buffer
	extra := fmt.Sprintf(`"stream":%q,"seq":%d`, m.stream, m.seq)
	if json.Compact(&buf, m.data) == nil && bytes.HasPrefix(buf.Bytes(), []byte("{")) {
		b := bytes.TrimSuffix(buf.Bytes(), []byte("}"))
		if bytes.Equal(b, []byte("{")) {
			return []byte("{" + extra + "}"), nil
		}
		return append(append(b, ','), []byte(extra+"}")...), nil
	}
	return json.Marshal(map[string]any{"stream": m.stream, "seq": m.seq, "nats_subject": m.subject, "malformed": string(m.data)})
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

func newProgress(w *os.File, total uint64, stdoutIsTTY bool) *progress {
	return &progress{w: w, on: isTerminal(w) && total > 0, total: total, start: time.Now(), outIsTTY: stdoutIsTTY}
}

func (p *progress) step() {
	p.n++
	if !p.on {
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
