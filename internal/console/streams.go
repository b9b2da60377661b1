package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// streamMsg is one stored event.
type streamMsg struct {
	Stream  string
	Seq     uint64
	Time    time.Time
	Subject string
	Header  nats.Header
	Data    []byte
	// Unconfirmed is its events.HeaderRedisUnconfirmed.
	Unconfirmed string
}

// readRange reads the messages of stream from (start sequence or start
// time) matching filters, at most limit, up to sequence end (0: the end now).
func readRange(ctx context.Context, js jetstream.JetStream, stream string, filters []string, startSeq uint64, startTime time.Time, end uint64, limit int) ([]streamMsg, error) {
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: filters, InactiveThreshold: 5 * time.Second}
	switch {
	case !startTime.IsZero():
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &startTime
	case startSeq > 1:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
	}
	var out []streamMsg
	err := scan(ctx, js, stream, cc, end, limit, func(m streamMsg) { out = append(out, m) })
	return out, err
}

// scan gives each message an ordered consumer of stream delivers to fn, at
// most limit, up to sequence end (0: the end now).
func scan(ctx context.Context, js jetstream.JetStream, stream string, cc jetstream.OrderedConsumerConfig, end uint64, limit int, fn func(streamMsg)) error {
	cons, err := js.OrderedConsumer(ctx, stream, cc)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	pending := info.NumPending
	if pending == 0 {
		return nil
	}
	// One iterator, not fetches: each fetch of an ordered consumer
	// replaces its consumer and deletes the one before, which no role may
	// (the server removes the consumer after its inactive threshold).
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer it.Stop()
	for n := 0; pending > 0 && n < limit; {
		mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := it.Next(jetstream.NextContext(mctx))
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		pending = meta.NumPending
		if end > 0 && meta.Sequence.Stream > end {
			break
		}
		n++
		fn(streamMsg{Stream: stream, Seq: meta.Sequence.Stream, Time: meta.Timestamp, Subject: m.Subject(), Header: m.Headers(), Data: m.Data(),
			Unconfirmed: m.Headers().Get(events.HeaderRedisUnconfirmed)})
	}
	return nil
}

// readFires reads the fired and skipped events of an entry since a moment
// (at most 2,000: a day of an entry that fires every minute, and more).
func (c *Console) readFires(ctx context.Context, src *Source, id string, since time.Time) ([]fireRow, error) {
	msgs, err := readRange(ctx, src.JS, src.Names.ActivityStream(), []string{src.Names.FireSubject(id)}, 0, since, 0, 2000)
	var out []fireRow
	var lost []events.TasksLost
	for _, m := range msgs {
		ev, derr := events.DecodeEvent(m.Data)
		if derr != nil {
			out = append(out, fireRow{Time: m.Time, Kind: "unreadable", Detail: derr.Error()})
			continue
		}
		switch ev.Type {
		case events.TypeEntryFired:
			var f events.Fired
			if ev.DecodeData(&f) != nil {
				continue
			}
			kind := "fired"
			switch {
			case f.Trigger != "":
				kind = "triggered"
			case f.Backfill:
				kind = "backfilled"
			}
			out = append(out, fireRow{Time: f.ScheduledAt, Kind: kind, Detail: fmt.Sprintf("task %s into %s by %s", f.TaskID, f.Queue, f.Replica), Queue: f.Queue, TaskID: f.TaskID})
		case events.TypeEntrySkipped:
			var s events.Skipped
			if ev.DecodeData(&s) != nil {
				continue
			}
			detail := s.Reason
			if s.Count > 1 {
				detail = fmt.Sprintf("%s (%d ticks)", s.Reason, s.Count)
			}
			out = append(out, fireRow{Time: s.ScheduledAt, Kind: "skipped", Detail: detail})
		case events.TypeTaskLost:
			var l events.TasksLost
			if ev.DecodeData(&l) != nil {
				continue
			}
			lost = append(lost, l)
			out = append(out, fireRow{Time: l.Until, Kind: "lost", Detail: l.Summary()})
		}
	}
	markLost(out, lost)
	return out, err
}

// markLost says so on each fire a lost record names.
func markLost(rows []fireRow, lost []events.TasksLost) {
	for i, f := range rows {
		if f.Kind != "fired" {
			continue
		}
		for _, l := range lost {
			if l.ScheduledAt != nil && l.Queue == f.Queue && !f.Time.Before(*l.ScheduledAt) && !f.Time.After(l.Until) {
				rows[i].Detail += "; Redis lost it (task.lost)"
				break
			}
		}
	}
}

// auditWindow is how many events of each stream one audit page searches.
const auditWindow = 2000

type auditQuery struct {
	Entry, Queue, Type string
	Stream             string // "", "config" or "activity"
	// Before: the page ends before these sequences (0: at the end now).
	ConfigBefore, ActivityBefore uint64
}

type auditRow struct {
	Stream  string
	Seq     uint64
	Time    time.Time
	Type    string
	Entry   string
	Queue   string
	Source  string
	Summary string
}

type auditData struct {
	Query    auditQuery
	Rows     []auditRow
	Older    template.URL
	Searched int
	Err      string
	Live     bool
}

func parseAuditQuery(r *http.Request) auditQuery {
	q := r.URL.Query()
	cb, _ := strconv.ParseUint(q.Get("config_before"), 10, 64)
	ab, _ := strconv.ParseUint(q.Get("activity_before"), 10, 64)
	typ := q.Get("type")
	if typ != "" && !strings.HasPrefix(typ, "cronstream.") {
		typ = "cronstream." + typ
	}
	return auditQuery{Entry: q.Get("entry"), Queue: q.Get("queue"), Type: typ, Stream: q.Get("stream"), ConfigBefore: cb, ActivityBefore: ab}
}

// readAudit reads the latest auditWindow events of each stream before the
// query's sequences, keeps those the filters match, latest first, at most
// limit; older is the query string of the page before.
func (c *Console) readAudit(ctx context.Context, src *Source, q auditQuery, limit int) (rows []auditRow, older template.URL, err error) {
	var all []streamMsg
	lowest := map[string]uint64{}
	for _, s := range []struct {
		kind, name string
		before     uint64
		filters    []string
	}{
		{"config", src.Names.ConfigStream(), q.ConfigBefore, src.Names.ConfigStreamSubjects()},
		{"activity", src.Names.ActivityStream(), q.ActivityBefore, nil},
	} {
		if q.Stream != "" && q.Stream != s.kind {
			continue
		}
		if q.Entry != "" {
			if s.kind == "config" {
				s.filters = src.Names.EntrySubjects(q.Entry)
			} else {
				s.filters = []string{src.Names.FireSubject(q.Entry)}
			}
		}
		st, serr := src.JS.Stream(ctx, s.name)
		if serr != nil {
			err = errors.Join(err, fmt.Errorf("stream %s: %w", s.name, serr))
			continue
		}
		end := st.CachedInfo().State.LastSeq
		if s.before > 0 {
			end = min(end, s.before-1)
		}
		if end == 0 {
			continue
		}
		start := uint64(1)
		if q.Entry == "" && end > auditWindow {
			start = end - auditWindow + 1
		}
		msgs, rerr := readRange(ctx, src.JS, s.name, s.filters, start, time.Time{}, end, auditWindow*4)
		if rerr != nil {
			err = errors.Join(err, rerr)
		}
		if len(msgs) > auditWindow {
			msgs = msgs[len(msgs)-auditWindow:]
		}
		if len(msgs) > 0 && start > 1 || len(msgs) == auditWindow {
			lowest[s.kind] = msgs[0].Seq
		}
		all = append(all, msgs...)
	}
	slices.SortFunc(all, func(a, b streamMsg) int { return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(b.Seq, a.Seq)) })
rows:
	for _, m := range all {
		for _, e := range eventsOf(m) {
			row, ok := c.auditRow(ctx, src, e, q)
			if !ok {
				continue
			}
			rows = append(rows, row)
			if len(rows) == limit {
				break rows
			}
		}
	}
	if len(lowest) > 0 {
		v := url.Values{}
		for k, s := range map[string]string{"entry": q.Entry, "queue": q.Queue, "type": strings.TrimPrefix(q.Type, "cronstream."), "stream": q.Stream} {
			if s != "" {
				v.Set(k, s)
			}
		}
		v.Set("config_before", strconv.FormatUint(cmp.Or(lowest["config"], 1), 10))
		v.Set("activity_before", strconv.FormatUint(cmp.Or(lowest["activity"], 1), 10))
		older = template.URL("/audit?" + v.Encode())
	}
	return rows, older, err
}

// eventsOf is a message as one message per event, latest first: a batch
// (a mass recovery's outcomes) is split; anything else stays whole.
func eventsOf(m streamMsg) []streamMsg {
	if !events.IsBatch(m.Data) {
		return []streamMsg{m}
	}
	parts, err := events.SplitEvents(m.Data)
	if err != nil {
		return []streamMsg{m}
	}
	out := make([]streamMsg, len(parts))
	for i, p := range parts {
		out[len(parts)-1-i] = m
		out[len(parts)-1-i].Data = p
	}
	return out
}

func (c *Console) auditRow(ctx context.Context, src *Source, m streamMsg, q auditQuery) (auditRow, bool) {
	row := auditRow{Stream: m.Stream, Seq: m.Seq, Time: m.Time}
	ev, err := events.DecodeEvent(m.Data)
	if err != nil {
		row.Type, row.Summary = "(unreadable)", err.Error()
		return row, q.Type == "" && q.Queue == ""
	}
	row.Type, row.Source = ev.Type, ev.Source
	if id, failPause, ok := src.Names.EntryFromHistorySubject(m.Subject); ok {
		row.Entry = id
		if _, e, err := events.DecodeConfigEvent(m.Data); err == nil && e != nil {
			row.Queue = e.Options.QueueName()
			row.Summary = "cron " + e.Cron + ", type " + e.Task.Type
			if e.Paused && e.Note != "" {
				row.Summary += ", note: " + e.Note
			}
		}
		if failPause {
			// A replica's request: say whether it applied, as the
			// configuration's readers decide.
			if err := events.NewClient(src.JS, src.Names).CheckFailPause(ctx, m.Subject, m.Header, m.Data); err != nil {
				row.Summary = "REFUSED fail-pause request, changed nothing (" + err.Error() + "); " + row.Summary
			} else {
				row.Summary = "on failure (fail-pause request): " + row.Summary
			}
		}
	} else if id, ok := src.Names.EntryFromFireSubject(m.Subject); ok {
		row.Entry = id
		var f events.Fired
		var l events.TasksLost
		if ev.Type == events.TypeTaskLost && ev.DecodeData(&l) == nil {
			row.Queue, row.Summary = l.Queue, l.Summary()
		} else if ev.DecodeData(&f) == nil && f.TaskID != "" {
			row.Queue = f.Queue
			row.Summary = fmt.Sprintf("tick %s, task %s", f.ScheduledAt.UTC().Format(time.RFC3339), f.TaskID)
		} else {
			var s events.Skipped
			if ev.DecodeData(&s) == nil {
				row.Summary = fmt.Sprintf("tick %s skipped: %s", s.ScheduledAt.UTC().Format(time.RFC3339), s.Reason)
			}
		}
	} else if queue, ok := src.Names.QueueFromRecoverySubject(m.Subject); ok {
		row.Queue = queue
		var t events.TaskRecovered
		if ev.DecodeData(&t) == nil {
			row.Summary = fmt.Sprintf("task %s (%s), retried %d/%d: %s", t.TaskID, t.Type, t.Retried, t.MaxRetry, t.Error)
		}
	}
	if m.Unconfirmed != "" {
		row.Summary += " [published before Redis replicas confirmed it: " + m.Unconfirmed + "]"
	}
	if q.Type != "" {
		// A gated config type matches its plain name too, as it shows.
		raw, _ := path.Match(q.Type, ev.Type)
		plain, _ := path.Match(q.Type, events.ConfigKind(ev.Type))
		if !raw && !plain {
			return row, false
		}
	}
	if q.Entry != "" && row.Entry != q.Entry {
		return row, false
	}
	if q.Queue != "" && row.Queue != q.Queue {
		return row, false
	}
	return row, true
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	q := parseAuditQuery(r)
	if q.Entry != "" {
		if err := events.ValidateID(q.Entry); err != nil {
			c.fail(w, r, fmt.Errorf("%w: entry: %w", errBadRequest, err))
			return
		}
	}
	rows, older, err := c.readAudit(ctx, src, q, pageSize)
	d := auditData{Query: q, Rows: rows, Older: older, Searched: auditWindow}
	if err != nil {
		d.Err = err.Error()
	}
	live := q.ConfigBefore == 0 && q.ActivityBefore == 0
	c.render(w, r, http.StatusOK, "audit", page{Title: "Audit", Live: live, Data: d})
}
