package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/projector"
	"github.com/cronstream/cronstream/schedule"
)

// pageSize is the rows of one page of a table.
const pageSize = 50

// entryQuery is the filter, order and page of the Entries and Time travel
// tables, as the query string gives them.
type entryQuery struct {
	State, Queue, Owner, Type, ID string
	// Selector is a Kubernetes label selector (events.ParseSelector), as
	// `entry ls --selector` takes it.
	Selector string
	// Sort is a column's key (sortKeys; "" is by id), Desc its direction.
	Sort   string
	Desc   bool
	Offset int

	sel events.Selector
}

// sortKeys are the keys of the columns a table sorts by.
var sortKeys = []string{"id", "state", "queue", "type", "owner", "revision", "last", "next"}

// parseEntryQuery reads the query string. The error (errBadRequest) names
// what is wrong; the query holds everything given, to show it again.
func parseEntryQuery(v url.Values) (entryQuery, error) {
	off, _ := strconv.Atoi(v.Get("offset"))
	q := entryQuery{State: v.Get("state"), Queue: v.Get("queue"), Owner: v.Get("owner"), Type: v.Get("type"), ID: v.Get("id"),
		Selector: v.Get("selector"), Sort: v.Get("sort"), Desc: v.Get("order") == "desc", Offset: max(off, 0)}
	var errs []error
	if q.Sort != "" && !slices.Contains(sortKeys, q.Sort) {
		errs = append(errs, fmt.Errorf("sort %q: want one of %s", q.Sort, strings.Join(sortKeys, ", ")))
	}
	if o := v.Get("order"); o != "" && o != "asc" && o != "desc" {
		errs = append(errs, fmt.Errorf("order %q: want asc or desc", o))
	}
	if q.State != "" && !slices.Contains([]entrystate.State{entrystate.Active, entrystate.Paused, entrystate.Ended, entrystate.Completed}, entrystate.State(q.State)) {
		errs = append(errs, fmt.Errorf("state %q: want active, paused, ended or completed", q.State))
	}
	sel, err := events.ParseSelector(q.Selector)
	if err != nil {
		errs = append(errs, fmt.Errorf("label selector: %w", err))
	}
	q.sel = sel
	if err := errors.Join(errs...); err != nil {
		return q, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	return q, nil
}

// keep reports whether e passes every filter but the state's.
func (q entryQuery) keep(e *events.Entry) bool {
	return (q.Queue == "" || e.Options.QueueName() == q.Queue) &&
		(q.Owner == "" || e.Owner == q.Owner) &&
		(q.Type == "" || strings.Contains(e.Task.Type, q.Type)) &&
		(q.ID == "" || strings.Contains(e.ID, q.ID)) &&
		q.sel.Matches(e.Labels)
}

// Filtered reports whether any filter is set.
func (q entryQuery) Filtered() bool {
	return q.State != "" || q.Queue != "" || q.Owner != "" || q.Type != "" || q.ID != "" || q.Selector != ""
}

// values is the query as a query string, with extra (time travel's
// moment), sort and offset as given.
func (q entryQuery) values(extra url.Values, sort string, desc bool, offset int) url.Values {
	v := url.Values{}
	for k, vs := range extra {
		v[k] = vs
	}
	for k, s := range map[string]string{"state": q.State, "queue": q.Queue, "owner": q.Owner, "type": q.Type, "id": q.ID, "selector": q.Selector, "sort": sort} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if desc {
		v.Set("order", "desc")
	}
	if offset > 0 {
		v.Set("offset", strconv.Itoa(offset))
	}
	return v
}

type entryRow struct {
	State projector.State
	// Status is the entry's state (entrystate: completed only on the live
	// table, which reads the fires counters).
	Status   entrystate.State
	NextFire time.Time
	// LastFire is the tick of the last fired or skipped event on the
	// entry's fire subject and LastOutcome what became of it (live table
	// only).
	LastFire    time.Time
	LastOutcome string
}

// column is one column of the table; Key is "" for one that does not sort.
type column struct {
	Label, Key string
	// Href sorts by this column: ascending, or descending when it is the
	// ascending order now.
	Href         template.URL
	Sorted, Desc bool
}

type tableData struct {
	Query   entryQuery
	Columns []column
	Rows    []entryRow
	Matched int
	Total   int
	// From and To are the rows shown (1-based), Page of Pages.
	From, To    int
	Page, Pages int
	// Query strings of the first, previous, next and last pages; "" where
	// there is no such page.
	First, Prev, Next, Last template.URL
	At                      time.Time
	AtInput                 string
	// Live: the table of the entries now (last fires, completed entries);
	// else a moment's (time travel).
	Live    bool
	Queues  []string
	Removed []projector.State // time travel: entries registered then, removed now
	// Note says what is partly unknown (completed entries or last fires
	// that could not be read).
	Note string
}

// matchRow is an entry that passed the filter, before it is paged.
type matchRow struct {
	st       *projector.State
	status   entrystate.State
	next     time.Time
	last     time.Time
	outcome  string
	hasTimes bool // next (and, live, last) are filled in
}

// table filters, sorts and pages states (sorted by id), as they are at
// at: the live table's (live, with completed entries and last fires) or
// a moment's. extra is kept in every link (time travel's moment).
func (c *Console) table(ctx context.Context, src *Source, states []*projector.State, q entryQuery, at time.Time, live bool, extra url.Values) tableData {
	d := tableData{Query: q, Total: len(states), At: at, Live: live}
	queues := map[string]bool{}
	var cand []*projector.State
	for _, st := range states {
		queues[st.Entry.Options.QueueName()] = true
		if q.keep(&st.Entry) {
			cand = append(cand, st)
		}
	}
	d.Queues = sortedQueues(queues)
	// Which entries are completed is read from their fires counters: of
	// every candidate when the filter or the order depends on it, else of
	// the page's rows only.
	var left map[string]entrystate.Left
	note := func(err error) {
		if err != nil {
			d.Note = strings.TrimPrefix(d.Note+"; "+err.Error(), "; ")
		}
	}
	everyRow := q.State == string(entrystate.Active) || q.State == string(entrystate.Completed) || q.Sort == "state" || q.Sort == "next"
	if live && everyRow {
		var err error
		left, err = c.firesLeft(ctx, src, cand)
		note(err)
	}
	matched := make([]matchRow, 0, len(cand))
	for _, st := range cand {
		s := entrystate.Current(st, left, at)
		if q.State == "" || string(s) == q.State {
			matched = append(matched, matchRow{st: st, status: s})
		}
	}
	d.Matched = len(matched)
	note(c.sortRows(ctx, src, matched, q, at, live))
	off := q.Offset
	if off >= len(matched) && len(matched) > 0 {
		off = (len(matched) - 1) / pageSize * pageSize // past the end: the last page
	}
	end := min(off+pageSize, len(matched))
	page := matched[min(off, end):end]
	if live && !everyRow {
		sts := make([]*projector.State, len(page))
		for i := range page {
			sts[i] = page[i].st
		}
		left, err := c.firesLeft(ctx, src, sts)
		note(err)
		for i := range page {
			page[i].status = entrystate.Current(page[i].st, left, at)
		}
	}
	for i := range page {
		if !page[i].hasTimes {
			page[i].next = nextFire(page[i].st.Entry, page[i].status, at)
		}
		d.Rows = append(d.Rows, entryRow{State: *page[i].st, Status: page[i].status, NextFire: page[i].next, LastFire: page[i].last, LastOutcome: page[i].outcome})
	}
	if live && q.Sort != "last" {
		c.addLastFires(ctx, src, d.Rows)
	}
	d.From, d.To = min(off+1, end), end
	d.Page, d.Pages = off/pageSize+1, max((len(matched)+pageSize-1)/pageSize, 1)
	link := func(o int) template.URL { return template.URL("?" + q.values(extra, q.Sort, q.Desc, o).Encode()) }
	if off > 0 {
		d.First, d.Prev = link(0), link(max(off-pageSize, 0))
	}
	if end < len(matched) {
		d.Next, d.Last = link(end), link((d.Pages-1)*pageSize)
	}
	d.Columns = columns(q, live, extra)
	return d
}

func sortedQueues(set map[string]bool) []string {
	if len(set) > 200 {
		return nil // a free-text field then
	}
	out := make([]string, 0, len(set))
	for q := range set {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

// columns are the table's columns with their sort links.
func columns(q entryQuery, live bool, extra url.Values) []column {
	cols := []column{{Label: "entry", Key: "id"}, {Label: "state", Key: "state"}, {Label: "cron"}, {Label: "queue", Key: "queue"},
		{Label: "type", Key: "type"}, {Label: "owner", Key: "owner"}, {Label: "revision", Key: "revision"}}
	if live {
		cols = append(cols, column{Label: "last fire (UTC)", Key: "last"})
	}
	cols = append(cols, column{Label: "next fire (UTC)", Key: "next"})
	sorted := cmp.Or(q.Sort, "id")
	for i := range cols {
		col := &cols[i]
		if col.Key == "" {
			continue
		}
		col.Sorted = col.Key == sorted
		col.Desc = col.Sorted && q.Desc
		// The first click sorts ascending, the next descending.
		col.Href = template.URL("?" + q.values(extra, col.Key, col.Sorted && !q.Desc, 0).Encode())
	}
	return cols
}

// sortRows orders the matched rows by the query's column, ties by id. An
// entry without a last or next fire comes last either way. Sorting by
// next or last fire reads them for every row (the last fires in one pass
// over the activity stream).
func (c *Console) sortRows(ctx context.Context, src *Source, rows []matchRow, q entryQuery, at time.Time, live bool) error {
	var err error
	switch q.Sort {
	case "", "id":
		if q.Desc {
			slices.Reverse(rows) // already by id
		}
		return nil
	case "next", "last":
		var last map[string]lastFire
		if q.Sort == "last" && live {
			last, err = c.lastFires(ctx, src)
		}
		for i := range rows {
			r := &rows[i]
			r.next, r.hasTimes = nextFire(r.st.Entry, r.status, at), true
			lf := last[r.st.Entry.ID]
			r.last, r.outcome = lf.tick, lf.outcome
		}
	}
	key := func(r *matchRow) (string, time.Time, uint64) {
		e := &r.st.Entry
		switch q.Sort {
		case "state":
			return string(r.status), time.Time{}, 0
		case "queue":
			return e.Options.QueueName(), time.Time{}, 0
		case "type":
			return e.Task.Type, time.Time{}, 0
		case "owner":
			return e.Owner, time.Time{}, 0
		case "revision":
			return "", time.Time{}, r.st.Revision
		case "last":
			return "", r.last, 0
		}
		return "", r.next, 0
	}
	slices.SortStableFunc(rows, func(a, b matchRow) int {
		as, at, an := key(&a)
		bs, bt, bn := key(&b)
		if at.IsZero() != bt.IsZero() {
			if at.IsZero() {
				return 1
			}
			return -1
		}
		o := cmp.Or(strings.Compare(as, bs), at.Compare(bt), cmp.Compare(an, bn))
		if q.Desc {
			o = -o
		}
		return cmp.Or(o, strings.Compare(a.st.Entry.ID, b.st.Entry.ID))
	})
	return err
}

// nextFire is the entry's next fire after the moment, jitter included;
// zero for an entry in a state that fires nothing.
func nextFire(e events.Entry, s entrystate.State, after time.Time) time.Time {
	if s != entrystate.Active {
		return time.Time{}
	}
	sch, err := schedule.NewSchedule(e)
	if err != nil {
		return time.Time{}
	}
	t := sch.NextFire(after)
	if t.IsZero() {
		return t
	}
	return t.Add(sch.Jitter(t)).UTC()
}

func (c *Console) entries(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	q, err := parseEntryQuery(r.URL.Query())
	if err != nil {
		// The form again, with what is wrong said above it.
		states := c.entriesOf(src)
		queues := map[string]bool{}
		for _, st := range states {
			queues[st.Entry.Options.QueueName()] = true
		}
		d := tableData{Query: q, Live: true, Columns: columns(q, true, nil), Page: 1, Pages: 1, Total: len(states), Queues: sortedQueues(queues)}
		msg := strings.TrimPrefix(err.Error(), errBadRequest.Error()+": ")
		c.render(w, r, http.StatusBadRequest, "entries", page{Title: "Entries", Error: msg, Data: d})
		return
	}
	d := c.table(ctx, src, c.entriesOf(src), q, c.now(src), true, nil)
	c.render(w, r, http.StatusOK, "entries", page{Title: "Entries", Data: d})
}

// lastFire is the tick and outcome of an entry's last fire event.
type lastFire struct {
	tick    time.Time
	outcome string
}

// lastFires reads the last event on every fire subject in one pass (an
// ordered consumer that delivers the last message of each subject): what
// sorting by last fire needs of every entry.
func (c *Console) lastFires(ctx context.Context, src *Source) (map[string]lastFire, error) {
	if src.JS == nil {
		return nil, nil
	}
	out := map[string]lastFire{}
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: []string{src.Names.FireFilter()}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, InactiveThreshold: time.Minute}
	err := scan(ctx, src.JS, src.Names.ActivityStream(), cc, 0, maxLastFires, func(m streamMsg) {
		if id, ok := src.Names.EntryFromFireSubject(m.Subject); ok {
			tick, outcome := lastOutcome(m.Data)
			out[id] = lastFire{tick, outcome}
		}
	})
	if err != nil {
		return out, fmt.Errorf("last fires: %w", err)
	}
	return out, nil
}

// maxLastFires bounds the entries whose last fire one sort reads.
const maxLastFires = 1_000_000

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
