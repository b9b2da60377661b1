package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/schedule"
)

// printJSON writes v as one indented JSON value.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable returns an aligned table writer; call Flush when done.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// fmtTime shows a time in UTC, RFC 3339, "-" when unset.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseTime reads a time flag: RFC 3339 ("2025-03-01T09:00:00Z"), a date
// or a date and time without zone (UTC), "now", or a duration relative to
// now ("-2h", "-30m", "+10m").
func parseTime(flag, s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "now" {
		return now, nil
	}
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		d, ok := durationWithDays(s[1:])
		if !ok {
			return time.Time{}, fmt.Errorf("--%s %q: not a relative time (use e.g. -2h, -30m, -1h30m, -7d)", flag, s)
		}
		if s[0] == '-' {
			d = -d
		}
		return now.Add(d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	if _, ok := durationWithDays(s); ok {
		return time.Time{}, fmt.Errorf("--%s %q: a relative time needs a sign: -%s means %s ago", flag, s, s, s)
	}
	return time.Time{}, fmt.Errorf("--%s %q: use RFC 3339 (2025-03-01T09:00:00Z), a date (2025-03-01, UTC), now, or a relative time (-2h, -7d)", flag, s)
}

// entryView is an entry as `entry get`, `entry ls` and `status` show it in
// JSON: the entry state (the contract's field names) plus where it stands.
type entryView struct {
	events.Entry
	Revision uint64     `json:"revision"`
	Updated  *time.Time `json:"updated,omitempty"`
	State    string     `json:"state"` // active, paused, ended or quarantined
	NextFire *time.Time `json:"next_fire,omitempty"`
	Error    string     `json:"error,omitempty"`
	// LastFire is the scheduled time of the entry's last tick with an
	// event, and LastOutcome what happened to it: fired, or skipped with
	// the reason (entry ls only).
	LastFire    *time.Time `json:"last_fire,omitempty"`
	LastOutcome string     `json:"last_outcome,omitempty"`
	// MaxFiresRemaining is how many scheduled ticks a limited entry may
	// still fire, when read from Redis (entry describe).
	MaxFiresRemaining *int `json:"max_fires_remaining,omitempty"`
	// MaxFiresUnknown: the fires counter could not be rebuilt after Redis
	// lost data, so the entry is completed until its limit changes.
	MaxFiresUnknown bool `json:"max_fires_count_unknown,omitempty"`
}

// setRemaining records a limited entry's remaining fires; at none an
// active entry is completed.
func (v *entryView) setRemaining(n int) {
	v.MaxFiresRemaining = &n
	if n == 0 && v.State == stateActive {
		v.State, v.NextFire = stateCompleted, nil
	}
}

// Entry states as shown.
const (
	stateActive      = "active"
	statePaused      = "paused"
	stateQuarantined = "quarantined"
	// stateEnded: past its end_at; it stays registered and fires nothing.
	stateEnded = "ended"
	// stateCompleted: a limited entry that fired its max_fires ticks; it
	// stays registered and fires nothing until the limit changes.
	stateCompleted = "completed"
)

func newEntryView(e events.Entry, rev uint64, updated time.Time, now time.Time) entryView {
	v := entryView{Entry: e, Revision: rev, State: stateActive}
	if !updated.IsZero() {
		u := updated.UTC()
		v.Updated = &u
	}
	if e.Ended(now) {
		v.State = stateEnded
		return v
	}
	if e.Paused {
		v.State = statePaused
		return v
	}
	if next, ok := nextFire(e, now); ok {
		v.NextFire = &next
	}
	return v
}

// nextFire is the entry's first fire time after now, jitter included.
func nextFire(e events.Entry, now time.Time) (time.Time, bool) {
	s, err := schedule.NewSchedule(e)
	if err != nil {
		return time.Time{}, false
	}
	tick := s.NextFire(now)
	if tick.IsZero() {
		return time.Time{}, false
	}
	return tick.Add(s.Jitter(tick)).UTC(), true
}

// tableOpts say how an entry table is printed.
type tableOpts struct {
	wide      bool // -o wide: the entry's policy columns too
	noHeaders bool
	// relative adds how long ago or ahead each time is, beside it (a
	// terminal), measured from now.
	relative bool
	now      time.Time
}

// when shows t as fmtTime does, with its distance from now when relative.
func (o tableOpts) when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return timeText{relative: o.relative, now: o.now}.at(*t)
}

// timeText shows times as fmtTime does and, on a terminal, how long ago
// or ahead each one is beside it: read by people, who should not have to
// subtract UTC times from their own clock. Pipes and files get the
// absolute time alone, as before.
type timeText struct {
	relative bool
	now      time.Time
}

// timesFor is the timeText for what is written to w: relative when w is
// a terminal.
func timesFor(w io.Writer) timeText {
	f, ok := w.(*os.File)
	return timeText{relative: ok && isTerminal(f), now: time.Now()}
}

// at shows t, with its distance from now when relative.
func (tt timeText) at(t time.Time) string {
	if !tt.relative || t.IsZero() {
		return fmtTime(t)
	}
	return fmtTime(t) + " (" + relTime(t, tt.now) + ")"
}

// relTime is how far t is from now, in its largest whole unit: "in 4m",
// "12s ago", "3d ago".
func relTime(t, now time.Time) string {
	d := t.Sub(now)
	ago := d < 0
	if ago {
		d = -d
	}
	var n string
	switch {
	case d < 2*time.Minute:
		n = fmt.Sprintf("%ds", int(d/time.Second))
	case d < 2*time.Hour:
		n = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		n = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		n = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	if ago {
		return n + " ago"
	}
	return "in " + n
}

const (
	entryColumns     = "ID\tSTATE\tCRON\tTIMEZONE\tTYPE\tQUEUE\tREVISION\tLAST FIRE\tNEXT FIRE\tOWNER"
	entryWideColumns = "\tCATCHUP\tOVERLAP\tJITTER\tMAX RETRY\tTIMEOUT\tUPDATED\tNOTE\tWINDOW\tEXCLUDE\tLABELS\tFIRES LEFT"
)

// printEntryTable lists entries, one line each (entry ls).
func printEntryTable(w io.Writer, views []entryView, o tableOpts) error {
	tw := newTable(w)
	if !o.noHeaders {
		head := entryColumns
		if o.wide {
			head += entryWideColumns
		}
		fmt.Fprintln(tw, head)
	}
	for _, v := range views {
		fmt.Fprintln(tw, entryRow(v, o))
	}
	return tw.Flush()
}

// entryRow is one entry's line of the table, its cells separated by tabs.
func entryRow(v entryView, o tableOpts) string {
	last := "-"
	if v.LastFire != nil {
		last = o.when(v.LastFire)
		if v.LastOutcome != "fired" {
			last += " " + terminalSafe(v.LastOutcome)
		}
	}
	if v.State == stateQuarantined {
		row := fmt.Sprintf("%s\t%s\t-\t-\t-\t-\t%d\t%s\t-\t-", terminalSafe(v.ID), v.State, v.Revision, last)
		if o.wide {
			row += fmt.Sprintf("\t-\t-\t-\t-\t-\t%s\t%s\t-\t-\t-\t-", o.when(v.Updated), terminalSafe(dash(v.Error)))
		}
		return row
	}
	row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s", terminalSafe(v.ID), v.State, terminalSafe(v.Cron), terminalSafe(dash(v.Timezone)),
		terminalSafe(v.Task.Type), terminalSafe(v.Options.QueueName()), v.Revision, last, o.when(v.NextFire), terminalSafe(dash(v.Owner)))
	if !o.wide {
		return row
	}
	e := v.Entry.Normalize()
	catchup := string(e.Catchup.Policy)
	if e.Catchup.Policy != events.CatchupNone {
		catchup += " " + e.Catchup.Window.String()
	}
	timeout := "-"
	if e.Options.Timeout > 0 {
		timeout = e.Options.Timeout.String()
	}
	jitter := "-"
	if e.Jitter > 0 {
		jitter = e.Jitter.String()
	}
	left := "-"
	switch {
	case v.MaxFiresRemaining != nil:
		left = fmt.Sprintf("%d/%d", *v.MaxFiresRemaining, e.MaxFires)
	case e.Limited():
		left = fmt.Sprintf("?/%d", e.MaxFires)
	}
	return row + fmt.Sprintf("\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s",
		terminalSafe(catchup), terminalSafe(string(e.Overlap)), jitter, e.Options.Retries(), timeout, o.when(v.Updated), terminalSafe(dash(v.Note)),
		windowText(e), terminalSafe(dash(strings.Join(e.Exclude, "; "))), terminalSafe(dash(labelsText(e.Labels))), left)
}

// printYAML writes v as YAML with the keys and order of its JSON form
// (JSON is YAML; decoding it into a node keeps the order).
func printYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("convert to yaml: %w", err)
	}
	clearStyle(&n)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return err
	}
	return enc.Close()
}

// clearStyle drops the flow style and quoting decoding JSON gave the
// nodes, so they print as block YAML.
func clearStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle | yaml.DoubleQuotedStyle
	for _, c := range n.Content {
		clearStyle(c)
	}
}

// printEntry shows one entry field by field.
func printEntry(w io.Writer, v entryView) error {
	times := timesFor(w)
	tw := newTable(w)
	row := func(k, val string) { fmt.Fprintf(tw, "%s:\t%s\n", terminalSafe(k), terminalSafe(val)) }
	e := v.Entry
	row("id", e.ID)
	row("state", v.State)
	if v.Error != "" {
		row("error", v.Error)
	}
	row("revision", fmt.Sprint(v.Revision))
	if v.Updated != nil {
		row("updated", times.at(*v.Updated))
	}
	if v.State != stateQuarantined {
		row("cron", e.Cron)
		row("timezone", e.Timezone)
		row("task.type", e.Task.Type)
		if len(e.Task.Payload) > 0 {
			row("task.payload", payloadText(e.Task.Payload))
		}
		for _, k := range sortedKeys(e.Task.Headers) {
			row("task.headers."+k, e.Task.Headers[k])
		}
		o := e.Options
		row("options.queue", o.QueueName())
		row("options.max_retry", fmt.Sprint(o.Retries()))
		for _, d := range []struct {
			k string
			d events.Duration
		}{{"options.timeout", o.Timeout}, {"options.deadline", o.Deadline}, {"options.unique", o.Unique}, {"options.retention", o.Retention}} {
			if d.d != 0 {
				row(d.k, d.d.String())
			}
		}
		if o.Group != "" {
			row("options.group", o.Group)
		}
		row("catchup.policy", string(e.Catchup.Policy))
		if e.Catchup.Window != 0 {
			row("catchup.window", e.Catchup.Window.String())
		}
		row("overlap", string(e.Overlap))
		if e.Jitter != 0 {
			row("jitter", e.Jitter.String())
		}
		if e.PauseOnFailure {
			row("pause_on_failure", "true")
		}
		if e.TickHeaders {
			row("tick_headers", "true")
		}
		if e.Note != "" {
			row("note", e.Note)
		}
		row("owner", dash(e.Owner))
		if !e.StartAt.IsZero() {
			row("start_at", fmtTime(e.StartAt))
		}
		if !e.EndAt.IsZero() {
			row("end_at", fmtTime(e.EndAt))
		}
		for _, x := range e.Exclude {
			row("exclude", x)
		}
		for _, k := range sortedKeys(e.Labels) {
			row("labels."+k, e.Labels[k])
		}
		if e.Limited() {
			row("max_fires", strconv.Itoa(e.MaxFires))
			if v.MaxFiresUnknown {
				row("max_fires remaining", "0 (count unknown after Redis lost data)")
			} else if v.MaxFiresRemaining != nil {
				row("max_fires remaining", strconv.Itoa(*v.MaxFiresRemaining))
			}
		}
		if v.NextFire != nil {
			row("next fire", times.at(*v.NextFire))
		}
	}
	return tw.Flush()
}

func payloadText(b []byte) string { return configsync.PayloadText(b) }

// labelsText writes labels as a selector would match them: k=v,k=v.
func labelsText(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range sortedKeys(labels) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// windowText is an entry's active window as "start..end" ("-" unbounded).
func windowText(e events.Entry) string {
	if e.StartAt.IsZero() && e.EndAt.IsZero() {
		return "-"
	}
	side := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return fmtTime(t)
	}
	return side(e.StartAt) + ".." + side(e.EndAt)
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// isTerminal reports whether f is a terminal (golang.org/x/term is not a
// dependency; a character device is what a terminal is).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// terminalSafe returns s with what a terminal would act on written as an
// escape: C0 and C1 controls, DEL, bidirectional overrides and isolates,
// and bytes that are not UTF-8. Everything else, other scripts and emoji
// included, stays as it is. Every text and table output passes what it
// did not write itself (ids, types, queues, notes, owners, payloads,
// reasons, errors) through it; JSON output is already escaped.
func terminalSafe(s string) string {
	clean := true
	for _, r := range s {
		if unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// terminalSafeLines is terminalSafe for text whose line breaks are meant
// (an error listing problems one a line).
func terminalSafeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = terminalSafe(l)
	}
	return strings.Join(lines, "\n")
}

func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f, r == utf8.RuneError:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true // bidi marks, embeddings, overrides and isolates
	}
	return false
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// characters that are literal there, so a printed command pastes as is.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(terminalSafe(s), "'", `'\''`) + "'"
}
