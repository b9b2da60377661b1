package console

import (
	"cmp"
	"context"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/projector"
)

// parseMoment reads a moment: RFC 3339, the datetime-local form
// (2006-01-02T15:04, UTC), or relative to now (-2h).
func parseMoment(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil && strings.HasPrefix(s, "-") {
		return now.Add(d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: moment %q: want RFC 3339, 2006-01-02T15:04 (UTC) or relative (-2h)", errBadRequest, s)
}

// streamStart is where the config stream begins: its first message's
// sequence and time (zero when it holds none).
type streamStart struct {
	Seq  uint64
	Time time.Time
}

func (c *Console) configStart(ctx context.Context, src *Source) (streamStart, error) {
	st, err := src.JS.Stream(ctx, src.Names.ConfigStream())
	if err != nil {
		return streamStart{}, fmt.Errorf("config stream: %w", err)
	}
	state := st.CachedInfo().State
	if state.Msgs == 0 {
		return streamStart{}, nil
	}
	return streamStart{Seq: state.FirstSeq, Time: state.FirstTime.UTC()}, nil
}

// timeTravelData is the Time travel page: the table as of At, and where
// the config stream begins.
type timeTravelData struct {
	tableData
	Start streamStart
	// Before: At is before the stream's first message, so nothing shows.
	Before bool
	// StartLink and HourAgo are the moments the page offers.
	StartLink, HourAgo string
}

func (c *Console) timeTravel(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	now := c.now(src)
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	start, err := c.configStart(ctx, src)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	raw := r.URL.Query().Get("at")
	at := start.Time // with no moment asked for, where the stream begins
	if raw != "" {
		at, err = parseMoment(raw, now)
		switch {
		case err != nil:
		case at.After(now.Add(time.Minute)):
			err = fmt.Errorf("%w: %s is in the future", errBadRequest, at.Format(time.RFC3339))
		case at.After(now):
			at = now // "now" by a clock a little ahead of the replicas'
		}
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := timeTravelData{Start: start, HourAgo: now.Add(-time.Hour).Format(time.RFC3339)}
	if !start.Time.IsZero() {
		d.StartLink = start.Time.Format(time.RFC3339Nano)
	}
	q, qerr := parseEntryQuery(r.URL.Query())
	if start.Time.IsZero() || at.Before(start.Time) || qerr != nil {
		// Nothing to show: no stream yet, a moment before it, or a filter
		// to correct (said above the form).
		d.Before = !start.Time.IsZero() && at.Before(start.Time)
		input := cmp.Or(raw, at.Format(time.RFC3339Nano))
		d.tableData = tableData{Query: q, At: at, AtInput: input, Page: 1, Pages: 1, Columns: columns(q, false, url.Values{"at": {input}})}
		code, msg := http.StatusOK, ""
		if qerr != nil {
			code, msg = http.StatusBadRequest, strings.TrimPrefix(qerr.Error(), errBadRequest.Error()+": ")
		}
		c.render(w, r, code, "timetravel", page{Title: "Time travel", Error: msg, Data: d})
		return
	}
	m, _, err := projector.AsOfTime(ctx, src.JS, src.Names, at)
	if err != nil {
		c.fail(w, r, fmt.Errorf("replay the config stream to %s: %w", at.Format(time.RFC3339), err))
		return
	}
	states := make([]*projector.State, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		st := m[id]
		states = append(states, &st)
	}
	input := cmp.Or(raw, at.Format(time.RFC3339Nano))
	d.tableData = c.table(ctx, src, states, q, at, false, url.Values{"at": {input}})
	d.AtInput = input
	// Which of the entries shown are gone now.
	live := map[string]bool{}
	for _, st := range c.entriesOf(src) {
		live[st.Entry.ID] = true
	}
	for _, row := range d.Rows {
		if !live[row.State.Entry.ID] {
			d.Removed = append(d.Removed, row.State)
		}
	}
	c.render(w, r, http.StatusOK, "timetravel", page{Title: "Time travel", Data: d})
}

// fcKey identifies a computed forecast: the projection's revision, the
// minute it starts and its window.
type fcKey struct {
	seq    uint64
	from   time.Time
	window time.Duration
}

type forecastView struct {
	F       *forecast.Forecast
	Chart   chart
	Window  string
	Windows []string
}

// chart is the stacked SVG chart of a forecast: one bar per column, the
// busiest minute of its stretch, split by group, on a y axis of fires per
// minute and an x axis of time (UTC).
type chart struct {
	Width, Height int
	Bars          []bar
	Legend        []legendItem
	// XTicks are times along the x axis; YTicks fires per minute up the
	// y axis, from 0 to the top of the scale (Top, at least Max).
	XTicks, YTicks []axisTick
	Peaks          []peakMark
	PerColumn      string
	Max, Top       int64
}

type bar struct {
	Title string
	Parts []rect
}

type rect struct {
	X, Y, W, H float64
	Class      string
}

type legendItem struct {
	Name, Class string
	Total       int64
}

// axisTick is a labelled tick: at X on a horizontal axis, or Y on a
// vertical one. Anchor is the label's text-anchor (start, middle, end).
type axisTick struct {
	X, Y   float64
	Label  string
	Anchor string
}

// peakMark marks a peak at its time; Label: the time is written beside it.
type peakMark struct {
	X, Y  float64
	Time  string
	Label bool
}

const (
	chartW, chartH = 960, 240
	maxColumns     = 240
)

func buildChart(f *forecast.Forecast) chart {
	ch := chart{Width: chartW, Height: chartH, Max: f.Max}
	cols := min(f.Minutes, maxColumns)
	per := (f.Minutes + cols - 1) / cols
	cols = (f.Minutes + per - 1) / per
	ch.PerColumn = (time.Duration(per) * time.Minute).String()
	colW := float64(chartW) / float64(cols)
	step, top := niceScale(f.Max, 5)
	ch.Top = top
	scale := float64(chartH) / float64(top)
	for v := int64(0); v <= top; v += step {
		ch.YTicks = append(ch.YTicks, axisTick{Y: float64(chartH) - float64(v)*scale, Label: forecast.Thousands(v), Anchor: "end"})
	}
	for i, g := range f.Groups {
		ch.Legend = append(ch.Legend, legendItem{Name: g.Name, Class: fmt.Sprintf("g%d", i%12), Total: g.Total})
	}
	for c := range cols {
		lo, hi := c*per, min((c+1)*per, f.Minutes)
		busiest := lo
		for m := lo; m < hi; m++ {
			if f.Totals[m] > f.Totals[busiest] {
				busiest = m
			}
		}
		b := bar{Title: fmt.Sprintf("%s UTC: %s fires", f.From.Add(time.Duration(busiest)*time.Minute).Format("Jan 2 15:04"), forecast.Thousands(f.Totals[busiest]))}
		y := float64(chartH)
		for i, g := range f.Groups {
			n := g.Counts[busiest]
			if n == 0 {
				continue
			}
			h := float64(n) * scale
			y -= h
			b.Parts = append(b.Parts, rect{X: float64(c) * colW, Y: y, W: max(colW-0.5, 0.5), H: h, Class: fmt.Sprintf("g%d", i%12)})
		}
		ch.Bars = append(ch.Bars, b)
	}
	ch.XTicks = timeTicks(f.From, time.Duration(f.Minutes)*time.Minute, chartW)
	var labelled []float64
	for _, pk := range f.Peaks {
		m := int(pk.At.Sub(f.From) / time.Minute)
		mark := peakMark{X: (float64(m/per) + 0.5) * colW, Y: float64(chartH) - float64(pk.Fires)*scale, Time: pk.At.Format("15:04")}
		// Peaks come busiest first: a label that would run into one
		// already placed is left to the mark's title.
		if !slices.ContainsFunc(labelled, func(x float64) bool { return math.Abs(x-mark.X) < 80 }) {
			mark.Label, labelled = true, append(labelled, mark.X)
		}
		ch.Peaks = append(ch.Peaks, mark)
	}
	return ch
}

// niceScale is the step and top of a y axis from 0 that holds peak in at
// most ticks steps of 1, 2 or 5 times a power of ten.
func niceScale(peak, ticks int64) (step, top int64) {
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if step = m * p; peak <= step*ticks {
				return step, max((peak+step-1)/step*step, step)
			}
		}
	}
}

// timeSteps are the spacings of time ticks, shortest first.
var timeSteps = []time.Duration{time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}

// timeTicks are the ticks of a time axis width wide from from over window:
// at whole steps (UTC) of the shortest spacing giving at most eight, each
// labelled with its time, and with its date where the window spans days.
func timeTicks(from time.Time, window time.Duration, width float64) []axisTick {
	step := timeSteps[len(timeSteps)-1]
	for _, s := range timeSteps {
		if window/s <= 8 {
			step = s
			break
		}
	}
	var out []axisTick
	for t := from.Truncate(step); !t.After(from.Add(window)); t = t.Add(step) {
		if t.Before(from) {
			continue
		}
		x := float64(t.Sub(from)) / float64(window) * width
		label := t.UTC().Format("15:04")
		if window > 24*time.Hour {
			label = t.UTC().Format("Jan 2 15:04")
			if t.Hour() == 0 && t.Minute() == 0 {
				label = t.UTC().Format("Jan 2")
			}
		}
		out = append(out, axisTick{X: x, Label: label, Anchor: anchor(x, width)})
	}
	return out
}

// anchor keeps a label at x inside an axis width wide.
func anchor(x, width float64) string {
	switch {
	case x < 24:
		return "start"
	case x > width-24:
		return "end"
	}
	return "middle"
}

var forecastWindows = []string{"1h", "6h", "24h", "72h", "168h"}

func (c *Console) forecast(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	window := 24 * time.Hour
	if s := r.URL.Query().Get("window"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Minute || d > forecast.MaxWindow {
			c.fail(w, r, fmt.Errorf("%w: window %q: want a duration between 1m and %s", errBadRequest, s, forecast.MaxWindow))
			return
		}
		window = d
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	v := c.forecastFor(ctx, src, window)
	c.render(w, r, http.StatusOK, "forecast", page{Title: "Forecast", Data: v})
}

// forecastFor computes (or reuses) the forecast of the projection as it is,
// from the current minute: the same revision and minute give the same
// forecast. Limited entries count no more ticks than they have left.
func (c *Console) forecastFor(ctx context.Context, src *Source, window time.Duration) *forecastView {
	var seq uint64
	if src.LastSeq != nil {
		seq = src.LastSeq()
	}
	key := fcKey{seq: seq, from: c.now(src).Truncate(time.Minute), window: window}
	c.fcMu.Lock()
	defer c.fcMu.Unlock() // one computation at a time; the rest wait for it
	if v, ok := c.fcCache[key]; ok {
		return v
	}
	states := c.entriesOf(src)
	fl, err := c.firesLeft(ctx, src, states)
	if err != nil {
		c.cfg.Logger.Warn("console: forecast without the fires left of limited entries", "err", err)
	}
	left := make(map[string]int, len(fl))
	for id, l := range fl {
		left[id] = l.Left
	}
	f := forecast.ComputeSeq(func(yield func(*events.Entry) bool) {
		for i := range states {
			if !yield(&states[i].Entry) {
				return
			}
		}
	}, forecast.Params{From: key.from, Window: window, By: forecast.ByQueue, Remaining: left})
	v := &forecastView{F: f, Chart: buildChart(f), Window: window.String(), Windows: forecastWindows}
	for _, w := range forecastWindows {
		if d, _ := time.ParseDuration(w); d == window {
			v.Window = w
		}
	}
	clear(c.fcCache) // only the latest revision and minute are asked for again
	c.fcCache[key] = v
	return v
}

var funcs = map[string]any{
	// ended: the entry is past its end_at (it fires nothing, and is
	// neither paused nor removed).
	"ended": func(e events.Entry) bool { return e.Ended(time.Now()) },
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"n":     func(n any) string { return forecast.Thousands(toInt64(n)) },
	"f1":    func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) },
	"short": events.DisplayType,
	"describe": func(ps forecast.PeakSpec, at time.Time) string {
		return ps.Describe(at)
	},
	"add":   func(a, b int) int { return a + b },
	"vis":   visible,
	"words": words,
	"mul10": func(i int) int { return i * 10 },
}

func toInt64(n any) int64 {
	switch x := n.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case uint64:
		return int64(x)
	}
	return 0
}

// words is text for a table cell that may wrap between words but never
// inside one: each word (visible, escaped) in a span that does not wrap.
func words(s string) template.HTML {
	var b strings.Builder
	for i, w := range strings.Fields(visible(s)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(`<span class="w">`)
		b.WriteString(template.HTMLEscapeString(w))
		b.WriteString(`</span>`)
	}
	return template.HTML(b.String()) // every word is escaped above
}

// visible writes control characters (a terminal escape in a note, say) as
// \xNN, so what a field holds shows; html/template escapes the rest.
func visible(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			fmt.Fprintf(&b, `\x%02x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }
