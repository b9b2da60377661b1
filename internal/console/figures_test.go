package console_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/projectiontest"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/testenv"
)

// evalJS evaluates a script in the browser's page and returns its value.
func evalJS[T any](b *browser, script string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](script))
	if err != nil {
		b.t.Fatalf("evaluate %.80q: %v", script, err)
	}
	return v
}

// width sets the browser's viewport width (the page is reloaded by the
// next visit).
func (b *browser) width(px int64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(px, 900)); err != nil {
		b.t.Fatalf("viewport %d px: %v", px, err)
	}
}

// brokenWords finds every word (a run of characters between blanks) of a
// table cell whose characters the browser laid out on more than one line:
// the line boxes of the word's range start at more than one height.
const brokenWords = `(() => {
  const broken = [];
  for (const cell of document.querySelectorAll("td, th")) {
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(/\S+/g)) {
        const r = document.createRange();
        r.setStart(n, m.index);
        r.setEnd(n, m.index + m[0].length);
        const tops = new Set();
        for (const box of r.getClientRects()) {
          if (box.width > 0 && box.height > 0) { tops.add(Math.round(box.top)); }
        }
        if (tops.size > 1) {
          broken.push(JSON.stringify(m[0]) + " on " + tops.size + " lines in <" + cell.tagName.toLowerCase() + "> " + JSON.stringify(cell.innerText.slice(0, 60)));
        }
      }
    }
  }
  return broken;
})()`

// pageOverflow is how far the page itself is wider than the window: wide
// tables scroll in their own box, the page never does.
const pageOverflow = `document.documentElement.scrollWidth - window.innerWidth`

// tableRows are the cells' text of each body row of the table selected.
func tableRows(b *browser, selector string) [][]string {
	b.t.Helper()
	return evalJS[[][]string](b, `Array.from(document.querySelectorAll(`+strconv.Quote(selector+" tbody tr")+`)).map(tr => Array.from(tr.cells).map(c => c.innerText.trim()))`)
}

// figures is the deployment TestConsoleFiguresInBrowser sets up.
type figures struct {
	peak     time.Time // when the billing entries all fire
	endAt    time.Time // retired-campaign's end
	selected []string  // the entries the selector team=ops,env in (prod) picks
}

const (
	billingEntries = 100
	probeEntries   = 10
	totalEntries   = billingEntries + probeEntries + 3
)

func billingID(i int) string { return fmt.Sprintf("billing-invoice-reconciliation-eu-west-%03d", i) }

// setUpFigures registers 100 labelled billing entries that all fire in
// one minute three hours ahead, 10 probes every five minutes, a paused
// entry, one past its end_at and one that completes its single fire.
func setUpFigures(t *testing.T, s *site) figures {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	fx := figures{peak: now.Add(3 * time.Hour).Truncate(time.Minute), endAt: now.Add(-time.Hour).Truncate(time.Second)}
	if fx.peak.Minute()%5 == 0 { // apart from the probes' minutes
		fx.peak = fx.peak.Add(time.Minute)
	}
	for i := range billingEntries {
		labels := map[string]string{"team": "billing", "env": "dev"}
		queue := "billing-critical"
		if i%2 == 1 {
			labels["team"], queue = "ops", "default"
		}
		if i%3 == 0 {
			labels["env"] = "prod"
		}
		if i%2 == 1 && i%3 == 0 {
			fx.selected = append(fx.selected, billingID(i))
		}
		s.put(events.Entry{ID: billingID(i), Cron: fmt.Sprintf("%d %d * * *", fx.peak.Minute(), fx.peak.Hour()),
			Task: events.Task{Type: "billing:reconcile-invoices-and-ledgers"}, Options: events.Options{Queue: queue},
			Owner: "team-billing-platform", Labels: labels})
	}
	for i := range probeEntries {
		s.put(events.Entry{ID: fmt.Sprintf("heartbeat-probe-%02d", i), Cron: "*/5 * * * *", Timezone: "Europe/Berlin",
			Task: events.Task{Type: "probe:http"}, Labels: map[string]string{"team": "platform"}})
	}
	s.put(events.Entry{ID: "paused-export", Cron: "@hourly", Task: events.Task{Type: "export:csv"}, Owner: "team-data"})
	if _, err := s.client.Pause(ctx, "paused-export", "waiting for the new bucket"); err != nil {
		t.Fatal(err)
	}
	s.put(events.Entry{ID: "retired-campaign", Cron: "@every 1h", Task: events.Task{Type: "mail:campaign"}, EndAt: fx.endAt})
	s.put(events.Entry{ID: "limited-once", Cron: "@every 1s", Task: events.Task{Type: "setup:once"}, MaxFires: 1})
	s.waitFor("/entries?state=completed", ">limited-once<")
	s.waitFor("/entries", fmt.Sprintf("of %d", totalEntries))
	return fx
}

// statusFigures computes what `cronstream status` computes, with the
// functions it calls: the entries counted by state over a projection of
// its own and the fires counters in Redis, the replicas from their
// heartbeats, and the config stream's last sequence.
func statusFigures(t *testing.T, s *site) (entrystate.Counts, []replica.Status, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	proj := projectiontest.CaughtUp(ctx, t, s.js, s.names)
	states := proj.States()
	_ = proj.Stop(ctx)
	left, err := entrystate.FiresLeft(ctx, s.store, s.names.Prefix(), states)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replica.ReadStatuses(ctx, s.js, s.names, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.js.Stream(ctx, s.names.ConfigStream())
	if err != nil {
		t.Fatal(err)
	}
	return entrystate.Count(states, left, time.Now()), reps, st.CachedInfo().State.LastSeq
}

// TestConsoleFiguresInBrowser sets up a deployment whose state it knows
// (113 entries, labelled; one paused, one ended, one completed; a live
// replica) and checks in headless Chromium that each page shows that
// state: the overview's counts and replica row are status's; the entries
// page pages both ways, sorts and filters by label; time travel opens
// where the config stream begins; the entry page shows unset fields as
// "—"; the charts' axes are the data's. At 1,400 and 800 pixels wide no
// table cell breaks a word, and the page itself never scrolls sideways.
func TestConsoleFiguresInBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	s := startSite(t, console.Config{})
	fx := setUpFigures(t, s)
	b.width(1400)

	t.Run("overview", func(t *testing.T) { checkOverview(t, b, s) })
	t.Run("entries", func(t *testing.T) { checkEntries(t, b, s, fx) })
	t.Run("entry", func(t *testing.T) { checkEntryPage(t, b, s, fx) })
	t.Run("timetravel", func(t *testing.T) { checkTimeTravel(t, b, s) })
	t.Run("forecast", func(t *testing.T) { checkForecast(t, b, s, fx) })
	t.Run("layout", func(t *testing.T) {
		pages := []string{"/", "/entries", "/entries?sort=next", "/entries?selector=" + url.QueryEscape("team=ops"),
			"/entries/limited-once", "/entries/" + billingID(7), "/timetravel", "/timetravel?at=-1s", "/forecast", "/audit"}
		for _, px := range []int64{1400, 800} {
			b.width(px)
			for _, p := range pages {
				b.visit(s.url(p))
				if broken := evalJS[[]string](b, brokenWords); len(broken) > 0 {
					t.Errorf("%s at %d px: %d words broken across lines:\n  %s", p, px, len(broken), strings.Join(broken[:min(len(broken), 10)], "\n  "))
				}
				if over := evalJS[int](b, pageOverflow); over > 0 {
					t.Errorf("%s at %d px: the page is %d px wider than the window", p, px, over)
				}
				footer := evalJS[string](b, `document.querySelector("footer").innerText`)
				if !regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · read-only$`).MatchString(footer) {
					t.Errorf("%s: footer %q: want the time and read-only, no debug figures", p, footer)
				}
			}
		}
		b.width(1400)
	})
}

// checkOverview: the cards count the entries as status counts them, and
// the replica row shows the heartbeat status reads.
func checkOverview(t *testing.T, b *browser, s *site) {
	want := entrystate.Counts{Active: billingEntries + probeEntries, Paused: 1, Ended: 1, Completed: 1}
	var counts entrystate.Counts
	var reps []replica.Status
	var last uint64
	// Steady: the replica's beat names the last config event.
	testenv.Eventually(t, 10*time.Second, func() bool {
		counts, reps, last = statusFigures(t, s)
		return len(reps) == 1 && reps[0].ConfigSeq == last
	}, "the replica's heartbeat never caught up with the config stream")
	if counts != want {
		t.Fatalf("status counts %+v, want %+v", counts, want)
	}
	b.visit(s.url("/"))
	cards := evalJS[map[string]string](b, `Object.fromEntries(Array.from(document.querySelectorAll("[data-count]")).map(c => [c.dataset.count, c.querySelector("b").innerText]))`)
	for name, n := range map[string]int{"replicas": 1, "active": counts.Active, "paused": counts.Paused, "ended": counts.Ended, "completed": counts.Completed, "quarantined": 0} {
		if cards[name] != strconv.Itoa(n) {
			t.Errorf("overview card %s shows %q, status counts %d (cards %v)", name, cards[name], n, cards)
		}
	}
	rows := tableRows(b, "table.replicas")
	if len(rows) != 1 || len(rows[0]) != 10 {
		t.Fatalf("replica rows %q", rows)
	}
	row, rep := rows[0], reps[0]
	if row[0] != rep.ID || row[1] != rep.Host || row[5] != strconv.FormatUint(rep.ConfigSeq, 10) || row[5] != strconv.FormatUint(last, 10) || row[6] != "0" || row[8] != rep.Ready {
		t.Errorf("replica row %q; status reads id %s host %s config seq %d (stream at %d) ready %q", row, rep.ID, rep.Host, rep.ConfigSeq, last, rep.Ready)
	}
	age, err := time.ParseDuration(strings.TrimSuffix(row[4], " ago"))
	if err != nil || !strings.HasSuffix(row[4], " ago") || age < 0 || age > 5*time.Second {
		t.Errorf("heartbeat %q: want a recent age (beats every 200ms), as status shows it", row[4])
	}
}

// checkEntries: paging forward and back, sorting by a column's link both
// ways, the label filter and its error.
func checkEntries(t *testing.T, b *browser, s *site, fx figures) {
	where := func() string { return evalJS[string](b, `document.getElementById("where").innerText`) }
	ids := func() []string {
		var out []string
		for _, r := range tableRows(b, "table.entries") {
			out = append(out, r[0])
		}
		return out
	}
	link := func(sel string) string {
		return evalJS[string](b, `(document.querySelector(`+strconv.Quote(sel)+`) || {href: ""}).href`)
	}
	b.visit(s.url("/entries"))
	pages := []struct {
		where, first, last string
		rows               int
	}{
		{"entries 1–50 of 113", billingID(0), billingID(49), 50},
		{"entries 51–100 of 113", billingID(50), billingID(99), 50},
		{"entries 101–113 of 113", "heartbeat-probe-00", "retired-campaign", 13},
	}
	check := func(i int) {
		t.Helper()
		p, got := pages[i], ids()
		if w := where(); w != p.where || len(got) != p.rows || got[0] != p.first || got[len(got)-1] != p.last {
			t.Fatalf("page %d: %q, rows %d (%s … %s); want %q, %d (%s … %s)", i+1, w, len(got), got[0], got[len(got)-1], p.where, p.rows, p.first, p.last)
		}
		if text := evalJS[string](b, `document.querySelector("nav.pager").innerText`); !strings.Contains(text, fmt.Sprintf("page %d of 3", i+1)) {
			t.Errorf("pager %q: want page %d of 3", text, i+1)
		}
	}
	check(0)
	if link("a[rel=prev]") != "" {
		t.Error("the first page links to a previous one")
	}
	for i := 1; i < 3; i++ {
		b.visit(link("a[rel=next]"))
		check(i)
	}
	if link("a[rel=next]") != "" {
		t.Error("the last page links to a next one")
	}
	states := map[string]string{}
	for _, r := range tableRows(b, "table.entries") {
		states[r[0]] = r[1]
	}
	for id, st := range map[string]string{"paused-export": "paused", "retired-campaign": "ended", "limited-once": "completed", "heartbeat-probe-03": "active"} {
		if states[id] != st {
			t.Errorf("%s shows as %q, want %s", id, states[id], st)
		}
	}
	b.visit(link("a[rel=prev]"))
	check(1)
	b.visit(link("a[rel=first]"))
	check(0)

	// Sorting: the header links, ascending then descending.
	b.visit(s.url("/entries"))
	b.visit(link(`th a[href*="sort=next"]`))
	if rows := tableRows(b, "table.entries"); !strings.HasPrefix(rows[0][0], "heartbeat-probe-") || !sortedColumn(rows[:50], 8, false) {
		t.Errorf("sorted by next fire, page 1 starts %q", rows[0])
	}
	b.visit(link("a[rel=last]"))
	if got := ids(); !slices.Equal(got[len(got)-3:], []string{"limited-once", "paused-export", "retired-campaign"}) {
		t.Errorf("sorted by next fire, the entries that fire nothing are not last: %q", got)
	}
	b.visit(s.url("/entries?sort=next"))
	b.visit(link(`th[aria-sort=ascending] a`))
	if rows := tableRows(b, "table.entries"); !strings.HasPrefix(rows[0][0], "billing-") || !sortedColumn(rows, 8, true) || !strings.Contains(where(), "1–50 of 113") {
		t.Errorf("sorted by next fire descending, page 1 starts %q", rows[0])
	}
	// Only limited-once has fired (and probes, at a fifth minute): the last
	// fires come first, newest first, the entries that never fired after.
	b.visit(s.url("/entries?sort=last&order=desc"))
	if rows := tableRows(b, "table.entries"); rows[0][7] == "—" || !sortedColumn(rows, 7, true) || rows[len(rows)-1][7] != "—" {
		t.Errorf("sorted by last fire descending: first %q, last %q", rows[0], rows[len(rows)-1])
	}
	if got := ids(); !slices.Contains(got[:probeEntries+1], "limited-once") {
		t.Errorf("sorted by last fire, limited-once (fired) is not among the first: %q", got[:probeEntries+1])
	}
	b.visit(s.url("/entries?sort=state&order=desc"))
	if got := ids(); !slices.Equal(got[:3], []string{"paused-export", "retired-campaign", "limited-once"}) {
		t.Errorf("sorted by state descending: %q", got[:3])
	}
	b.visit(s.url("/entries?sort=revision&order=desc"))
	if rows := tableRows(b, "table.entries"); rows[0][0] != "limited-once" || !sortedNumbers(rows, 6, true) {
		t.Errorf("sorted by revision descending: %q", rows[0])
	}

	// The label filter, as entry ls --selector takes it.
	b.visit(s.url("/entries?selector=" + url.QueryEscape("team=ops, env in (prod)")))
	if got, w := ids(), fmt.Sprintf("entries 1–%d of %d matching (113 in all)", len(fx.selected), len(fx.selected)); !slices.Equal(got, fx.selected) || where() != w {
		t.Errorf("selector: %q %q, want %q %q", where(), got, w, fx.selected)
	}
	bad := "team in (billing"
	_, perr := events.ParseSelector(bad)
	text := b.visitStatus(s.url("/entries?selector="+url.QueryEscape(bad)), 400)
	if perr == nil || !strings.Contains(text, perr.Error()) {
		t.Errorf("a bad selector's page does not say %v:\n%s", perr, text)
	}
	if v := evalJS[string](b, `document.querySelector("input[name=selector]").value`); v != bad {
		t.Errorf("the selector field holds %q, want the selector given", v)
	}
}

// sortedColumn reports whether column col of rows is in time order
// ("2006-01-02 15:04:05", "—" last), or the reverse with desc.
func sortedColumn(rows [][]string, col int, desc bool) bool {
	var times []string
	for _, r := range rows {
		if r[col] != "—" {
			times = append(times, r[col])
		}
	}
	if desc {
		slices.Reverse(times)
	}
	return len(times) > 0 && slices.IsSorted(times)
}

func sortedNumbers(rows [][]string, col int, desc bool) bool {
	var ns []int
	for _, r := range rows {
		n, err := strconv.Atoi(r[col])
		if err != nil {
			return false
		}
		ns = append(ns, n)
	}
	if desc {
		slices.Reverse(ns)
	}
	return slices.IsSorted(ns)
}

// checkEntryPage: unset fields show as "—", set ones as they are; the fire
// strip has a time axis.
func checkEntryPage(t *testing.T, b *browser, s *site, fx figures) {
	fields := func(id string) map[string]string {
		b.visit(s.url("/entries/" + id))
		return evalJS[map[string]string](b, `Object.fromEntries(Array.from(document.querySelectorAll("table.fields tr")).map(tr => [tr.cells[0].innerText.trim(), tr.cells[1].innerText.trim()]))`)
	}
	for id, want := range map[string]map[string]string{
		"heartbeat-probe-00": {"state": "active", "timezone": "Europe/Berlin", "timeout": "30m", "deadline": "—", "unique": "—", "retention": "—",
			"group": "—", "catchup": "—", "jitter": "—", "payload": "—", "note": "—", "owner": "—", "start at": "—", "end at": "—",
			"exclude": "—", "labels": "team=platform", "overlap": "allow", "pause on failure": "—"},
		"retired-campaign": {"state": "ended", "end at": fx.endAt.Format(time.RFC3339)},
		"paused-export":    {"state": "paused", "note": "waiting for the new bucket", "owner": "team-data"},
		"limited-once":     {"state": "completed", "max fires": "1 (0 left)"},
	} {
		got := fields(id)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: field %s shows %q, want %q", id, k, got[k], v)
			}
		}
		for k, v := range got {
			if v == "" || v == "0s" || strings.Contains(v, "within 0s") {
				t.Errorf("%s: field %s shows %q for unset", id, k, v)
			}
		}
	}
	ticks := evalJS[[]string](b, `Array.from(document.querySelectorAll("svg.strip text")).map(t => t.textContent)`)
	if len(ticks) < 3 {
		t.Errorf("fire strip ticks %q: want one every six hours", ticks)
	}
	for _, tk := range ticks {
		if !slices.Contains([]string{"00:00", "06:00", "12:00", "18:00"}, tk) {
			t.Errorf("fire strip tick %q: want a sixth hour", tk)
		}
	}
}

// checkTimeTravel: with no moment the page opens at the config stream's
// first message; before it, it says there is nothing.
func checkTimeTravel(t *testing.T, b *browser, s *site) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, s.names.ConfigStream())
	if err != nil {
		t.Fatal(err)
	}
	first := st.CachedInfo().State.FirstTime.UTC()
	text := b.visit(s.url("/timetravel"))
	begins := "The config stream begins at " + first.Format("2006-01-02 15:04:05") + " UTC (sequence 1)"
	if !strings.Contains(text, begins) || !strings.Contains(text, "entries 1–1 of 1") {
		t.Errorf("time travel opens elsewhere than where the stream begins (%q):\n%s", begins, text)
	}
	if rows := tableRows(b, "table.entries"); len(rows) != 1 || rows[0][0] != billingID(0) {
		t.Errorf("time travel to the first message shows %q, want the first entry registered", rows)
	}
	text = b.visit(s.url("/timetravel?at=" + url.QueryEscape(first.Add(-time.Hour).Format(time.RFC3339))))
	if !strings.Contains(text, "before the config stream begins") || !strings.Contains(text, begins) {
		t.Errorf("time travel before the stream:\n%s", text)
	}
}

// checkForecast: the y axis runs from 0 in even steps up to at least the
// busiest minute, and the peak's bar is as tall as its figure on that
// scale; the x axis ticks are the times their place on the axis stands for.
func checkForecast(t *testing.T, b *browser, s *site, fx figures) {
	text := b.visit(s.url("/forecast?window=24h"))
	if !strings.Contains(text, fmt.Sprintf("the busiest minute has %d", billingEntries)) {
		t.Fatalf("forecast does not find the %d fires of %s:\n%s", billingEntries, fx.peak, text)
	}
	type tick struct {
		X, Y  float64
		Label string
	}
	yt := evalJS[[]tick](b, `Array.from(document.querySelectorAll("svg.chart text.y-tick")).map(t => ({X: +t.getAttribute("x"), Y: +t.getAttribute("y"), Label: t.textContent}))`)
	if len(yt) < 3 || yt[0].Label != "0" {
		t.Fatalf("y axis ticks %+v: want several from 0", yt)
	}
	height, step := yt[0].Y, 0
	for i, tk := range yt {
		v, err := strconv.Atoi(strings.ReplaceAll(tk.Label, ",", ""))
		if i == 1 {
			step = v
		}
		if err != nil || v != i*step || tk.Y < 0 || abs(tk.Y-height*(1-float64(i)/float64(len(yt)-1))) > 0.5 {
			t.Fatalf("y axis ticks %+v: want even steps from 0 at the bottom to the top", yt)
		}
	}
	top := (len(yt) - 1) * step
	if top < billingEntries || top >= 2*billingEntries {
		t.Errorf("y axis tops at %d for a busiest minute of %d", top, billingEntries)
	}
	title := fx.peak.Format("Jan 2 15:04") + " UTC: 100 fires"
	bar := evalJS[float64](b, `Array.from(document.querySelectorAll("svg.chart g")).filter(g => g.querySelector("title") && g.querySelector("title").textContent === `+strconv.Quote(title)+`).map(g => Array.from(g.querySelectorAll("rect")).reduce((h, r) => h + +r.getAttribute("height"), 0))[0] || 0`)
	if want := height * billingEntries / float64(top); abs(bar-want) > 0.5 {
		t.Errorf("the bar %q is %.1f high, want %.1f on the axis", title, bar, want)
	}
	from := regexp.MustCompile(`from (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC`).FindStringSubmatch(text)
	if from == nil {
		t.Fatalf("forecast does not say where it starts:\n%s", text)
	}
	start, _ := time.Parse("2006-01-02 15:04:05", from[1])
	width := evalJS[float64](b, `+document.querySelector("svg.chart").viewBox.baseVal.width - 72`)
	xt := evalJS[[]tick](b, `Array.from(document.querySelectorAll("svg.chart text.x-tick")).map(t => ({X: +t.getAttribute("x"), Y: 0, Label: t.textContent}))`)
	if len(xt) < 4 {
		t.Fatalf("x axis ticks %+v", xt)
	}
	for _, tk := range xt {
		at := start.Add(time.Duration(tk.X / width * float64(24*time.Hour))).Round(time.Minute)
		if at.Format("15:04") != tk.Label || at.Minute() != 0 || at.Hour()%3 != 0 {
			t.Errorf("x tick %q stands at %s: want whole three hours labelled with their time", tk.Label, at)
		}
	}
}

func abs(x float64) float64 { return max(x, -x) }
