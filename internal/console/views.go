package console

import (
	"context"
	"fmt"
	"maps"
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

func (c *Console) timeTravel(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	start := time.Now()
	now := c.cfg.Now().UTC()
	raw := r.URL.Query().Get("at")
	if raw == "" {
		c.render(w, r, http.StatusOK, "timetravel", page{Title: "Time travel", Data: tableData{AtInput: now.Add(-time.Hour).Format("2006-01-02T15:04")}, Server: time.Since(start)})
		return
	}
	at, err := parseMoment(raw, now)
	if err == nil && at.After(now) {
		err = fmt.Errorf("%w: %s is in the future", errBadRequest, at.Format(time.RFC3339))
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
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
	d := table(states, parseEntryFilter(r.URL.Query()), at, url.Values{"at": {raw}})
	d.AtInput = raw
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
	c.render(w, r, http.StatusOK, "timetravel", page{Title: "Time travel", Data: d, Server: time.Since(start)})
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
// busiest minute of its stretch, split by group.
type chart struct {
	Width, Height int
	Bars          []bar
	Legend        []legendItem
	Ticks         []axisTick
	Peaks         []peakMark
	PerColumn     string
	Max           int64
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

type axisTick struct {
	X     float64
	Label string
}

type peakMark struct {
	X, Y  float64
	Label string
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
	scale := float64(chartH) / float64(max(f.Max, 1))
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
	for i := range 5 {
		m := i * f.Minutes / 4
		ch.Ticks = append(ch.Ticks, axisTick{X: float64(m) / float64(f.Minutes) * chartW, Label: f.From.Add(time.Duration(m) * time.Minute).Format("15:04")})
	}
	for _, pk := range f.Peaks {
		m := int(pk.At.Sub(f.From) / time.Minute)
		ch.Peaks = append(ch.Peaks, peakMark{X: (float64(m/per) + 0.5) * colW, Y: float64(chartH) - float64(pk.Fires)*scale, Label: pk.At.Format("15:04")})
	}
	return ch
}

var forecastWindows = []string{"1h", "6h", "24h", "72h", "168h"}

func (c *Console) forecast(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	start := time.Now()
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
	c.render(w, r, http.StatusOK, "forecast", page{Title: "Forecast", Data: v, Server: time.Since(start)})
}

// forecastFor computes (or reuses) the forecast of the projection as it is,
// from the current minute: the same revision and minute give the same
// forecast. Limited entries count no more ticks than they have left.
func (c *Console) forecastFor(ctx context.Context, src *Source, window time.Duration) *forecastView {
	var seq uint64
	if src.LastSeq != nil {
		seq = src.LastSeq()
	}
	key := fcKey{seq: seq, from: c.cfg.Now().UTC().Truncate(time.Minute), window: window}
	c.fcMu.Lock()
	defer c.fcMu.Unlock() // one computation at a time; the rest wait for it
	if v, ok := c.fcCache[key]; ok {
		return v
	}
	states := c.entriesOf(src)
	left := map[string]int{}
	for _, st := range states {
		if n, ok := firesLeft(ctx, src, *st); ok {
			left[st.Entry.ID] = n
		}
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
