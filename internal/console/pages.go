package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/scheduler"
)

// pageSize is the rows of one page of a table.
const pageSize = 50

// readTimeout bounds the stream reads of one page.
const readTimeout = 10 * time.Second

type queueCount struct {
	Queue          string
	Active, Paused int
	// Tasks are the queue's asynq task counts; nil when unread (TasksErr
	// says why, or there is no Redis store).
	Tasks    *taskstate.QueueStats
	TasksErr string
}

type overviewData struct {
	Replicas    []Replica
	ReplicasErr string
	Backlog     int64
	HasBacklog  bool
	Late        []stall.Late
	Queues      []queueCount
	Active      int
	Paused      int
	Quarantined []projector.Quarantine
	Recoveries  []auditRow
	LastSeq     uint64
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	d := overviewData{}
	if src.Replicas != nil {
		reps, err := src.Replicas(ctx)
		d.Replicas = reps
		if err != nil {
			d.ReplicasErr = err.Error()
		}
	}
	if src.Backlog != nil {
		d.Backlog, d.HasBacklog = src.Backlog(), true
	}
	if src.Late != nil {
		d.Late = src.Late()
	}
	if src.Quarantined != nil {
		d.Quarantined = src.Quarantined()
	}
	if src.LastSeq != nil {
		d.LastSeq = src.LastSeq()
	}
	queues := map[string]*queueCount{}
	for _, st := range c.entriesOf(src) {
		q := st.Entry.Options.QueueName()
		qc, ok := queues[q]
		if !ok {
			qc = &queueCount{Queue: q}
			queues[q] = qc
		}
		if st.Entry.Paused {
			qc.Paused++
			d.Paused++
		} else {
			qc.Active++
			d.Active++
		}
	}
	if src.Tasks != nil {
		c.queueTasks(ctx, src.Tasks, queues)
	}
	for _, qc := range queues {
		d.Queues = append(d.Queues, *qc)
	}
	slices.SortFunc(d.Queues, func(a, b queueCount) int { return strings.Compare(a.Queue, b.Queue) })
	if rows, _, err := c.readAudit(ctx, src, auditQuery{Type: "cronstream.task.*", Stream: "activity"}, 10); err == nil {
		d.Recoveries = rows
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Live: true, Data: d, Server: time.Since(start)})
}

// queueTasks reads the asynq task counts of every queue an entry names or
// asynq knows, one round trip per queue.
func (c *Console) queueTasks(ctx context.Context, store *taskstate.Store, queues map[string]*queueCount) {
	known, err := store.Queues(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: list asynq queues", "err", err)
	}
	for _, q := range known {
		if queues[q] == nil {
			queues[q] = &queueCount{Queue: q}
		}
	}
	for q, qc := range queues {
		qs, err := store.QueueStats(ctx, q)
		if err != nil {
			qc.TasksErr = err.Error()
			continue
		}
		qc.Tasks = &qs
	}
}

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

// entryFilter is the filter of the Entries and Time travel tables.
type entryFilter struct {
	State, Queue, Owner, Type, ID string
	Offset                        int
}

func parseEntryFilter(q url.Values) entryFilter {
	off, _ := strconv.Atoi(q.Get("offset"))
	return entryFilter{State: q.Get("state"), Queue: q.Get("queue"), Owner: q.Get("owner"), Type: q.Get("type"), ID: q.Get("id"), Offset: max(off, 0)}
}

func (f entryFilter) keep(e events.Entry) bool {
	ended := e.Ended(time.Now())
	switch f.State {
	case "active":
		if e.Paused || ended {
			return false
		}
	case "paused":
		if !e.Paused || ended {
			return false
		}
	case "ended":
		if !ended {
			return false
		}
	case "completed":
		// Only a limited active entry can be; whether it is, is read
		// from Redis (onlyCompleted).
		if !e.Limited() || e.Paused || ended {
			return false
		}
	}
	return (f.Queue == "" || e.Options.QueueName() == f.Queue) &&
		(f.Owner == "" || e.Owner == f.Owner) &&
		(f.Type == "" || strings.Contains(e.Task.Type, f.Type)) &&
		(f.ID == "" || strings.Contains(e.ID, f.ID))
}

// query returns the filter as a query string with offset replaced.
func (f entryFilter) query(extra url.Values, offset int) string {
	v := url.Values{}
	for k, vs := range extra {
		v[k] = vs
	}
	for k, s := range map[string]string{"state": f.State, "queue": f.Queue, "owner": f.Owner, "type": f.Type, "id": f.ID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if offset > 0 {
		v.Set("offset", strconv.Itoa(offset))
	}
	return v.Encode()
}

type entryRow struct {
	State    projector.State
	NextFire time.Time
	// LastFire is the tick of the last fired or skipped event on the
	// entry's fire subject and LastOutcome what became of it (live page
	// only).
	LastFire    time.Time
	LastOutcome string
	// Completed: a limited entry whose fires counter reached its
	// max_fires (read from Redis; live page only).
	Completed bool
}

// firesLeft reads how many fires a limited entry has left from its fires
// counter in Redis (docs/design.md INV-max-fires); known is false for an
// entry without a limit, or when Redis could not be read.
func firesLeft(ctx context.Context, src *Source, st projector.State) (left int, known bool) {
	e := st.Entry
	if !e.Limited() || src.Tasks == nil {
		return 0, false
	}
	c, ok, err := src.Tasks.FireCount(ctx, src.Names.Prefix(), e.Options.QueueName(), e.ID)
	if err != nil {
		return 0, false
	}
	fired := 0
	if ok && c.Since == st.MaxFiresSince {
		fired = c.Count
	}
	return max(e.MaxFires-fired, 0), true
}

// splitCompleted returns the states of completed entries (completed) or
// those of the others: the completed and active filters of the live
// entries table, which need each limited entry's fires counter in Redis.
// An entry whose counter cannot be read counts as not completed.
func splitCompleted(ctx context.Context, src *Source, states []*projector.State, completed bool) []*projector.State {
	out := make([]*projector.State, 0, len(states))
	for _, st := range states {
		left, known := firesLeft(ctx, src, *st)
		if (known && left == 0) == completed {
			out = append(out, st)
		}
	}
	return out
}

type tableData struct {
	Filter     entryFilter
	Rows       []entryRow
	Matched    int
	Total      int
	From, To   int
	Prev, Next template.URL // query strings; "" when there is no such page
	At         time.Time
	AtInput    string
	Queues     []string
	Removed    []projector.State // time travel: entries registered then, removed now
}

// table filters and pages states (sorted by id), with each row's next
// fire after at.
func table(states []*projector.State, f entryFilter, at time.Time, extra url.Values) tableData {
	d := tableData{Filter: f, Total: len(states), At: at}
	queues := map[string]bool{}
	off := f.Offset
	for i := range states {
		e := &states[i].Entry
		queues[e.Options.QueueName()] = true
		if !f.keep(*e) {
			continue
		}
		if d.Matched >= off && d.Matched < off+pageSize {
			d.Rows = append(d.Rows, entryRow{State: *states[i]})
		}
		d.Matched++
	}
	for q := range queues {
		d.Queues = append(d.Queues, q)
	}
	slices.Sort(d.Queues)
	if len(d.Queues) > 200 {
		d.Queues = nil // a free-text field then
	}
	for i := range d.Rows {
		d.Rows[i].NextFire = nextFire(d.Rows[i].State.Entry, at)
	}
	end := min(off+pageSize, d.Matched)
	d.From, d.To = min(off+1, end), end
	if off > 0 {
		d.Prev = template.URL("?" + f.query(extra, max(off-pageSize, 0)))
	}
	if end < d.Matched {
		d.Next = template.URL("?" + f.query(extra, end))
	}
	return d
}

func nextFire(e events.Entry, after time.Time) time.Time {
	if e.Paused {
		return time.Time{}
	}
	s, err := scheduler.NewSchedule(e)
	if err != nil {
		return time.Time{}
	}
	t := s.NextFire(after)
	if t.IsZero() {
		return t
	}
	return t.Add(s.Jitter(t)).UTC()
}

func (c *Console) entries(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	f := parseEntryFilter(r.URL.Query())
	states := c.entriesOf(src)
	if f.State == "active" || f.State == "completed" {
		states = splitCompleted(ctx, src, states, f.State == "completed")
	}
	d := table(states, f, c.cfg.Now(), nil)
	c.addLastFires(ctx, src, d.Rows)
	for i := range d.Rows {
		if left, ok := firesLeft(ctx, src, d.Rows[i].State); ok && left == 0 {
			d.Rows[i].Completed, d.Rows[i].NextFire = true, time.Time{}
		}
	}
	c.render(w, r, http.StatusOK, "entries", page{Title: "Entries", Data: d, Server: time.Since(start)})
}

// addLastFires reads the last event on each row's fire subject (one direct
// get each, a page at a time, a few at once). A row whose read fails keeps
// no last fire; the failure is logged once per page.
func (c *Console) addLastFires(ctx context.Context, src *Source, rows []entryRow) {
	if src.JS == nil || len(rows) == 0 {
		return
	}
	stream, err := src.JS.Stream(ctx, src.Names.ActivityStream())
	if err != nil {
		c.cfg.Logger.Warn("console: read last fires", "err", err)
		return
	}
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 8)
		errMu sync.Mutex
		first error
	)
	for i := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func(row *entryRow) {
			defer func() { <-sem; wg.Done() }()
			m, err := stream.GetLastMsgForSubject(ctx, src.Names.FireSubject(row.State.Entry.ID))
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgNotFound) {
					errMu.Lock()
					first = cmp.Or(first, err)
					errMu.Unlock()
				}
				return
			}
			row.LastFire, row.LastOutcome = lastOutcome(m.Data)
		}(&rows[i])
	}
	wg.Wait()
	if first != nil {
		c.cfg.Logger.Warn("console: read last fires", "err", first)
	}
}

// lastOutcome is the tick and outcome a fired or skipped event records.
func lastOutcome(data []byte) (time.Time, string) {
	ev, err := events.DecodeEvent(data)
	if err != nil {
		return time.Time{}, ""
	}
	switch ev.Type {
	case events.TypeEntryFired:
		var d events.Fired
		if ev.DecodeData(&d) == nil {
			return d.ScheduledAt.UTC(), "fired"
		}
	case events.TypeEntrySkipped:
		var d events.Skipped
		if ev.DecodeData(&d) == nil {
			t := d.ScheduledAt
			if d.Until != nil {
				t = *d.Until
			}
			return t.UTC(), "skipped (" + d.Reason + ")"
		}
	}
	return time.Time{}, ""
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
	Kind   string    // fired, triggered, backfilled, skipped
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
	Strip     []stripCell
	FiresErr  string
	StatesErr string
	Late      *stall.Late
	Payloads  bool
	// Completed: the entry fired its max_fires (see firesLeft).
	Completed bool
}

type field struct{ Name, Value string }

func (c *Console) entry(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	start := time.Now()
	id := r.PathValue("id")
	if err := events.ValidateID(id); err != nil {
		c.fail(w, r, fmt.Errorf("%w: %w", errBadRequest, err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	now := c.cfg.Now().UTC()
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
			rv.Type, rv.Source = strings.TrimPrefix(rec.Event.Type, "cronstream."), rec.Event.Source
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
		d.Fields = c.fields(d.State.Entry)
		if left, ok := firesLeft(ctx, src, *d.State); ok {
			d.Completed = left == 0
			d.Fields = append(d.Fields, field{"max fires", fmt.Sprintf("%d (%d left)", d.State.Entry.MaxFires, left)})
		}
		if !d.State.Entry.Paused && !d.Completed {
			if s, err := scheduler.NewSchedule(d.State.Entry); err == nil {
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
	c.render(w, r, http.StatusOK, "entry", page{Title: "Entry " + id, Nav: "entries", Data: d, Server: time.Since(start)})
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

func (c *Console) fields(e events.Entry) []field {
	payload, headers := "(hidden: --console-payloads shows it)", "(hidden)"
	if c.cfg.Payloads {
		payload = configsync.PayloadText(e.Task.Payload)
		var hs []string
		for _, k := range slices.Sorted(mapsKeys(e.Task.Headers)) {
			hs = append(hs, k+"="+e.Task.Headers[k])
		}
		headers = strings.Join(hs, ", ")
	}
	if len(e.Task.Payload) == 0 {
		payload = "(none)"
	}
	if len(e.Task.Headers) == 0 {
		headers = "(none)"
	}
	retries := strconv.Itoa(e.Options.Retries())
	fs := []field{
		{"cron", e.Cron}, {"timezone", cmp.Or(e.Timezone, "UTC")}, {"type", e.Task.Type},
		{"queue", e.Options.QueueName()}, {"payload", payload}, {"headers", headers},
		{"max retry", retries}, {"timeout", e.Options.Timeout.String()}, {"deadline", e.Options.Deadline.String()},
		{"unique", e.Options.Unique.String()}, {"retention", e.Options.Retention.String()}, {"group", e.Options.Group},
		{"catchup", fmt.Sprintf("%s within %s", e.Catchup.Policy, e.Catchup.Window)},
		{"overlap", string(e.Overlap)}, {"jitter", e.Jitter.String()},
		{"paused", strconv.FormatBool(e.Paused)}, {"pause on failure", strconv.FormatBool(e.PauseOnFailure)},
		{"note", e.Note}, {"owner", e.Owner},
		{"start at", timeField(e.StartAt)}, {"end at", timeField(e.EndAt)},
		{"exclude", strings.Join(e.Exclude, "; ")}, {"labels", labelsField(e.Labels)},
	}
	for i := range fs {
		fs[i].Value = visible(fs[i].Value)
	}
	return fs
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// strip is the last 24 hours in 48 half-hour cells, each the most notable
// kind of fire in it (late over skipped over triggered/backfilled over fired).
func strip(fires []fireRow, now time.Time, late *stall.Late) []stripCell {
	const cells = 48
	start := now.Add(-24 * time.Hour)
	out := make([]stripCell, cells)
	rank := map[string]int{"": 0, "fired": 1, "backfilled": 2, "triggered": 2, "skipped": 3, "late": 4}
	for i := range out {
		t := start.Add(time.Duration(i) * 30 * time.Minute)
		out[i].Label = t.Format("15:04") + " UTC: no fires"
	}
	set := func(t time.Time, kind string) {
		i := int(t.Sub(start) / (30 * time.Minute))
		if i < 0 || i >= cells {
			return
		}
		out[i].Count++
		if rank[kind] > rank[out[i].Kind] {
			out[i].Kind = kind
		}
		out[i].Label = fmt.Sprintf("%s UTC: %d events, %s", start.Add(time.Duration(i)*30*time.Minute).Format("15:04"), out[i].Count, out[i].Kind)
	}
	for _, f := range fires {
		set(f.Time, f.Kind)
	}
	if late != nil {
		set(late.Due, "late")
	}
	return out
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
