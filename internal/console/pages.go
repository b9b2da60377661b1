package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// readTimeout bounds the stream reads of one page.
const readTimeout = 10 * time.Second

// entriesOf returns the projection's entries, sorted by id. The sorted
// list is kept until the projection's revision changes; it shares the
// projection's states (never copied: 100,000 of them cost more than a page
// may) and pages only read them.
func (c *Console) entriesOf(src *Source) []*projector.State {
	if src.Entries == nil {
		return nil
	}
	if src.LastSeq == nil {
		return sortedByID(src.Entries())
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	if seq := src.LastSeq(); c.snap == nil || seq != c.snapSeq {
		// Read the revision first: the list is at least as new as it.
		c.snap, c.snapSeq = sortedByID(src.Entries()), seq
	}
	return c.snap
}

func sortedByID(states []*projector.State) []*projector.State {
	slices.SortFunc(states, func(a, b *projector.State) int { return strings.Compare(a.Entry.ID, b.Entry.ID) })
	return states
}

type revision struct {
	Seq     uint64
	Time    time.Time
	Type    string
	Source  string
	Err     string
	Changes []configsync.FieldChange
}

type fireRow struct {
	Time   time.Time // scheduled tick
	Kind   string    // fired, triggered, backfilled, skipped, lost
	Detail string
	// Queue and TaskID name the task a fire enqueued ("" for a skip);
	// State is its asynq state now.
	Queue, TaskID, State string
}

type stripCell struct {
	Kind  string
	Count int
	Label string
}

type entryData struct {
	ID        string
	State     *projector.State
	Fields    []field
	Revisions []revision
	Next      []time.Time
	Fires     []fireRow
	Strip     stripChart
	FiresErr  string
	StatesErr string
	Late      *stall.Late
	Payloads  bool
	// Status is the entry's state; Completed: it fired its max_fires.
	Status    entrystate.State
	Completed bool
}

type field struct{ Name, Value string }

func (c *Console) entry(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := events.ValidateID(id); err != nil {
		c.fail(w, r, fmt.Errorf("%w: %w", errBadRequest, err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	now := c.now(src)
	d := entryData{ID: id, Payloads: c.cfg.Payloads}
	states := c.entriesOf(src)
	if i, ok := slices.BinarySearchFunc(states, id, func(s *projector.State, id string) int { return strings.Compare(s.Entry.ID, id) }); ok {
		st := *states[i]
		d.State = &st
	}
	client := events.NewClient(src.JS, src.Names)
	recs, err := client.History(ctx, id)
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		c.fail(w, r, fmt.Errorf("history of %s: %w", id, err))
		return
	}
	if d.State == nil && len(recs) == 0 {
		c.message(w, r, http.StatusNotFound, "No such entry", "No entry "+id+" was ever registered.")
		return
	}
	var prev events.Entry
	for _, rec := range recs {
		rv := revision{Seq: rec.Seq, Time: rec.Time}
		if rec.Event != nil {
			rv.Type, rv.Source = events.DisplayType(rec.Event.Type), rec.Event.Source
		}
		if rec.FailPause {
			// A replica's fail-pause request, not an operator's config event.
			rv.Type += " (on failure)"
		}
		if rec.Err != nil {
			rv.Err = rec.Err.Error()
		}
		if rec.Entry != nil {
			rv.Changes = c.hidePayloads(configsync.Diff(prev, *rec.Entry))
			prev = *rec.Entry
		}
		d.Revisions = append(d.Revisions, rv)
	}
	slices.Reverse(d.Revisions)
	if d.State != nil {
		left, err := c.firesLeft(ctx, src, []*projector.State{d.State})
		if err != nil {
			c.cfg.Logger.Warn("console: read fires left", "entry", id, "err", err)
		}
		d.Status = entrystate.Current(d.State, left, now)
		d.Completed = d.Status == entrystate.Completed
		d.Fields = c.fields(d.State.Entry, d.Status)
		switch l, ok := left[id]; {
		case ok:
			d.Fields = append(d.Fields, field{"max fires", fmt.Sprintf("%d (%d left)", d.State.Entry.MaxFires, l.Left)})
		case d.State.Entry.Limited():
			d.Fields = append(d.Fields, field{"max fires", fmt.Sprintf("%d (fires left unknown)", d.State.Entry.MaxFires)})
		}
		if d.Status == entrystate.Active {
			if s, err := schedule.NewSchedule(d.State.Entry); err == nil {
				for t, i := s.NextFire(now), 0; !t.IsZero() && i < 10; t, i = s.NextFire(t), i+1 {
					d.Next = append(d.Next, t.Add(s.Jitter(t)).UTC())
				}
			}
		}
	}
	if src.Late != nil {
		for _, l := range src.Late() {
			if l.Entry == id {
				d.Late = &l
			}
		}
	}
	d.Fires, err = c.readFires(ctx, src, id, now.Add(-24*time.Hour))
	if err != nil {
		d.FiresErr = err.Error()
	}
	d.Strip = strip(d.Fires, now, d.Late)
	slices.Reverse(d.Fires)
	if len(d.Fires) > 50 {
		d.Fires = d.Fires[:50]
	}
	if err := taskStates(ctx, src.Tasks, d.Fires); err != nil {
		d.StatesErr = err.Error()
	}
	c.render(w, r, http.StatusOK, "entry", page{Title: "Entry " + id, Nav: "entries", Data: d})
}

// taskStates fills in the asynq state of each fire's task, in one round
// trip. Without a store the states stay blank.
func taskStates(ctx context.Context, store *taskstate.Store, fires []fireRow) error {
	if store == nil {
		return nil
	}
	var refs []taskstate.TaskRef
	var rows []int
	for i, f := range fires {
		if f.TaskID != "" {
			refs = append(refs, taskstate.TaskRef{Queue: f.Queue, ID: f.TaskID})
			rows = append(rows, i)
		}
	}
	states, err := store.TaskStates(ctx, refs)
	if err != nil {
		return fmt.Errorf("asynq states of the recent tasks: %w", err)
	}
	for j, i := range rows {
		fires[i].State = states[j]
	}
	return nil
}

// hidePayloads replaces payload and header values unless payloads are shown.
func (c *Console) hidePayloads(ch []configsync.FieldChange) []configsync.FieldChange {
	if c.cfg.Payloads {
		return ch
	}
	for i := range ch {
		if ch[i].Field == "task.payload" || strings.HasPrefix(ch[i].Field, "task.headers") {
			if ch[i].Old != "" {
				ch[i].Old = "(hidden)"
			}
			if ch[i].New != "" {
				ch[i].New = "(hidden)"
			}
		}
	}
	return ch
}

// unset is how a field that is not set shows.
const unset = "—"

// fields are the entry's configuration as the entry page lists it: every
// field, an unset one as "—".
func (c *Console) fields(e events.Entry, status entrystate.State) []field {
	payload, headers := "(hidden: --console-payloads shows it)", "(hidden)"
	if c.cfg.Payloads {
		payload = configsync.PayloadText(e.Task.Payload)
		var hs []string
		for _, k := range slices.Sorted(maps.Keys(e.Task.Headers)) {
			hs = append(hs, k+"="+e.Task.Headers[k])
		}
		headers = strings.Join(hs, ", ")
	}
	if len(e.Task.Payload) == 0 {
		payload = ""
	}
	if len(e.Task.Headers) == 0 {
		headers = ""
	}
	catchup := ""
	if e.Catchup.Policy != "" && e.Catchup.Policy != events.CatchupNone {
		catchup = fmt.Sprintf("%s within %s", e.Catchup.Policy, e.Catchup.Window)
	}
	fs := []field{
		{"state", string(status)},
		{"cron", e.Cron}, {"timezone", cmp.Or(e.Timezone, "UTC")}, {"type", e.Task.Type},
		{"queue", e.Options.QueueName()}, {"payload", payload}, {"headers", headers},
		{"max retry", strconv.Itoa(e.Options.Retries())}, {"timeout", durationField(e.Options.Timeout)}, {"deadline", durationField(e.Options.Deadline)},
		{"unique", durationField(e.Options.Unique)}, {"retention", durationField(e.Options.Retention)}, {"group", e.Options.Group},
		{"catchup", catchup}, {"overlap", string(e.Overlap)}, {"jitter", durationField(e.Jitter)},
		{"pause on failure", boolField(e.PauseOnFailure)}, {"tick headers", boolField(e.TickHeaders)},
		{"note", e.Note}, {"owner", e.Owner},
		{"start at", timeField(e.StartAt)}, {"end at", timeField(e.EndAt)},
		{"exclude", strings.Join(e.Exclude, "; ")}, {"labels", labelsField(e.Labels)},
	}
	for i := range fs {
		fs[i].Value = cmp.Or(visible(fs[i].Value), unset)
	}
	return fs
}

// durationField is an optional duration: "" when unset.
func durationField(d events.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// boolField is an option that is off unless set: "yes", or "" when unset.
func boolField(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

// stripChart is the fire strip: the last 24 hours in 48 half-hour cells,
// with a time axis.
type stripChart struct {
	Cells []stripCell
	Ticks []axisTick
}

// strip is the last 24 hours in 48 half-hour cells (the last one the
// current half hour), each the most notable kind of fire in it (late over
// lost over skipped over triggered/backfilled over fired), with a tick at every
// sixth hour (UTC).
func strip(fires []fireRow, now time.Time, late *stall.Late) stripChart {
	const cells, cellW = 48, 10
	const half = 30 * time.Minute
	start := now.Truncate(half).Add(-(cells - 1) * half)
	out := make([]stripCell, cells)
	rank := map[string]int{"": 0, "fired": 1, "backfilled": 2, "triggered": 2, "skipped": 3, "lost": 4, "late": 5}
	for i := range out {
		t := start.Add(time.Duration(i) * half)
		out[i].Label = t.Format("15:04") + " UTC: no fires"
	}
	set := func(t time.Time, kind string) {
		i := int(t.Sub(start) / half)
		if t.Before(start) || i >= cells {
			return
		}
		out[i].Count++
		if rank[kind] > rank[out[i].Kind] {
			out[i].Kind = kind
		}
		out[i].Label = fmt.Sprintf("%s UTC: %d events, %s", start.Add(time.Duration(i)*half).Format("15:04"), out[i].Count, out[i].Kind)
	}
	for _, f := range fires {
		set(f.Time, f.Kind)
	}
	if late != nil {
		set(late.Due, "late")
	}
	ch := stripChart{Cells: out}
	for i := range cells + 1 {
		if t := start.Add(time.Duration(i) * half); t.Minute() == 0 && t.Hour()%6 == 0 {
			ch.Ticks = append(ch.Ticks, axisTick{X: float64(i * cellW), Label: t.Format("15:04"), Anchor: anchor(float64(i*cellW), cells*cellW)})
		}
	}
	return ch
}

// timeField is an optional time as the entry page shows it.
func timeField(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// labelsField is an entry's labels as k=v, sorted.
func labelsField(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ", ")
}
