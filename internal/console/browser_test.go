package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
)

// chromiumPath finds headless Chromium. In CI (CI=true) its absence fails
// the test: the browser tests are part of the suite there.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not on PATH: the browser tests need it (apt-get install -y chromium; .ci/run installs it)")
	}
	// Outside CI a developer without chromium still runs every other test;
	// CI (CI=true, set by .ci/run, which installs chromium) fails above.
	t.Skip("chromium is not on PATH: skipping the browser tests (apt-get install -y chromium to run them)")
	return ""
}

// browser is one headless Chromium tab that records console errors,
// uncaught exceptions, error log entries (CSP violations, failed loads) and
// dialogs (an alert() that ran).
type browser struct {
	t      *testing.T
	ctx    context.Context
	mu     sync.Mutex
	errors []string
	// expected are errors a test asked for (a page answered 401 or 404).
	expected map[string]bool
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // as root in CI containers
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		acancel()
	})
	b := &browser{t: t, ctx: ctx}
	if err := chromedp.Listen(ctx, b.event); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("Log.enable: %v", err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("Runtime.enable: %v", err)
	}
	return b
}

func (b *browser) event(ev any) {
	var msg string
	switch e := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			msg = "console." + string(e.Type) + ": " + strings.Join(parts, " ")
		}
	case *runtime.EventExceptionThrown:
		msg = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
	case *cdplog.EventEntryAdded:
		if e.Entry.Level == cdplog.EntryLevelError {
			msg = fmt.Sprintf("log %s: %s (%s)", e.Entry.Source, e.Entry.Text, e.Entry.URL)
		}
	case *page.EventJavascriptDialogOpening:
		msg = "dialog opened: " + e.Message
	}
	if msg != "" {
		b.mu.Lock()
		if !b.expected[msg] {
			b.errors = append(b.errors, msg)
		}
		b.mu.Unlock()
	}
}

// visit loads url, waits for its main element and returns the page's text.
// Any console error, exception or error log entry fails the test.
func (b *browser) visit(url string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("main"))); err != nil {
		b.t.Fatalf("load %s: %v", url, err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		b.t.Fatalf("text of %s: %v", url, err)
	}
	// Every script element must be a same-origin file (the CSP would
	// refuse an inline one, and the log would say so).
	inline, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Array.from(document.scripts).filter(s => !s.src).length`))
	if err != nil {
		b.t.Fatalf("scripts of %s: %v", url, err)
	}
	if inline != 0 {
		b.t.Errorf("%s has %d inline scripts", url, inline)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errors) > 0 {
		b.t.Errorf("%s: browser errors:\n  %s", url, strings.Join(b.errors, "\n  "))
		b.errors = nil
	}
	return text
}

// visitStatus is visit for a page answered with status code: the error
// Chromium logs for that answer is expected; any other still fails.
func (b *browser) visitStatus(url string, code int) string {
	b.t.Helper()
	b.mu.Lock()
	if b.expected == nil {
		b.expected = map[string]bool{}
	}
	b.expected[fmt.Sprintf("log network: Failed to load resource: the server responded with a status of %d (%s) (%s)", code, http.StatusText(code), url)] = true
	b.mu.Unlock()
	return b.visit(url)
}

// sessionCookie returns the browser's console session cookie for url.
func (b *browser) sessionCookie(url string) *network.Cookie {
	b.t.Helper()
	res, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{url}})
	if err != nil {
		b.t.Fatalf("cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == "cronstream_session" {
			return c
		}
	}
	return nil
}

// TestConsoleSignInInBrowser signs in through the form in headless
// Chromium: the token is posted, never put in an address or the history;
// the browser keeps an HTTP-only, SameSite=Strict session cookie that is not
// the token (and that scripts cannot read); a forged cookie opens nothing;
// signing out ends the session; /static/ lists nothing.
func TestConsoleSignInInBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	const token = "s3cret-browser-token"
	s := startSite(t, console.Config{Token: token})
	s.put(events.Entry{ID: "nightly-report", Cron: "0 0 * * *", Task: events.Task{Type: "report:build"}})

	if text := b.visitStatus(s.url("/entries?queue=default"), 401); !strings.Contains(text, "needs the token") {
		t.Fatalf("no sign-in page:\n%s", text)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`form[action="/login"] button`)),
		chromedp.WaitNotPresent(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS("main")),
	); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || loc != s.url("/entries?queue=default") {
		t.Fatalf("after signing in at %q (%v), want the page asked for", loc, err)
	}
	if text := b.visit(loc); !strings.Contains(text, "nightly-report") || !strings.Contains(text, "Sign out") {
		t.Fatalf("signed in, the entries page does not show:\n%s", text)
	}
	hist, err := chromedp.Call(ctx, page.GetNavigationHistory, cdp.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist.Entries {
		if strings.Contains(e.URL, token) {
			t.Errorf("the token is in the history: %s", e.URL)
		}
	}
	ck := b.sessionCookie(s.url("/"))
	if ck == nil || ck.Value == token || strings.Contains(ck.Value, token) || !ck.HTTPOnly || ck.SameSite != network.CookieSameSiteStrict || ck.Session {
		t.Fatalf("session cookie %+v: want one that is not the token, HTTP-only, SameSite=Strict, expiring", ck)
	}
	if seen, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`)); err != nil || seen != "" {
		t.Errorf("scripts read the cookie: %q %v", seen, err)
	}

	// A forged session opens nothing; the real one again does.
	forged := []byte(ck.Value)
	forged[len(forged)-3] ^= 0x04
	setCookie := func(v string) {
		t.Helper()
		if _, err := chromedp.Call(ctx, network.SetCookie, network.SetCookieParams{Name: "cronstream_session", Value: v, URL: s.url("/"), SameSite: network.CookieSameSiteStrict}); err != nil {
			t.Fatal(err)
		}
	}
	setCookie(string(forged))
	if text := b.visitStatus(s.url("/"), 401); !strings.Contains(text, "needs the token") {
		t.Errorf("a forged session opened the overview:\n%s", text)
	}
	setCookie(ck.Value)
	if text := b.visit(s.url("/")); !strings.Contains(text, "live replicas") {
		t.Fatalf("the real session no longer works:\n%s", text)
	}

	// Sign out: the cookie goes, the pages ask for the token again.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
	); err != nil {
		t.Fatalf("sign out: %v", err)
	}
	if ck := b.sessionCookie(s.url("/")); ck != nil {
		t.Errorf("cookie %+v left after signing out", ck)
	}
	if text := b.visitStatus(s.url("/"), 401); !strings.Contains(text, "needs the token") {
		t.Errorf("signed out, the overview still shows:\n%s", text)
	}
	if text := b.visitStatus(s.url("/static/"), 404); !strings.Contains(text, "Not found") || strings.Contains(text, "live.js") {
		t.Errorf("/static/ in the browser:\n%s", text)
	}
}

// screenshot writes the full page to docs/img/name when
// CRONSTREAM_SCREENSHOTS=1 (the README's pictures).
func (b *browser) screenshot(name string) {
	b.t.Helper()
	if os.Getenv("CRONSTREAM_SCREENSHOTS") != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join("..", "..", "docs", "img", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("wrote %s", path)
}

// TestConsoleInBrowser loads every page in headless Chromium against a
// running replica with real NATS and Redis.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	s := startSite(t, console.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s.put(events.Entry{ID: "evil", Cron: "@every 1h", Task: events.Task{Type: "x:evil"}, Owner: `"><img src=x onerror=alert(2)>`})
	if _, err := s.client.Pause(ctx, "evil", hostileNote); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		q := []string{"reports", "billing"}[i%2]
		s.put(events.Entry{ID: fmt.Sprintf("nightly-%02d", i), Cron: "0 0 * * *", Task: events.Task{Type: "report:build"}, Options: events.Options{Queue: q}, Owner: "team-reports"})
	}
	s.put(events.Entry{ID: "heartbeat", Cron: "@every 1m", Task: events.Task{Type: "ping"}, Jitter: events.Duration(20 * time.Second)})
	s.put(events.Entry{ID: "invoice-run", Cron: "*/15 * * * *", Timezone: "Europe/Berlin", Task: events.Task{Type: "billing:invoice"}, Options: events.Options{Queue: "billing"}, Owner: "team-billing"})
	s.put(events.Entry{ID: "gone", Cron: "*/5 * * * *", Task: events.Task{Type: "old:job"}})
	if _, err := s.client.Put(ctx, events.Entry{ID: "invoice-run", Cron: "*/10 * * * *", Timezone: "Europe/Berlin", Task: events.Task{Type: "billing:invoice"}, Options: events.Options{Queue: "billing"}, Owner: "team-billing"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	hist, err := s.client.History(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	s.waitFor("/entries?id=invoice", "*/10 * * * *")

	for _, p := range []struct {
		path string
		want []string
	}{
		{"/", []string{"console-r1", "reports", "billing", "live replicas"}},
		{"/entries", []string{"evil", "nightly-00", "invoice-run", "paused"}},
		{"/entries?queue=billing&owner=team-billing", []string{"invoice-run", "entries 1–1 of 1 matching (43 in all)"}},
		{"/timetravel?at=" + hist[0].Time.UTC().Format(time.RFC3339Nano), []string{"gone", "old:job", "removed since"}},
		{"/audit", []string{"entry.removed", "entry.paused", "entry.registered"}},
	} {
		text := b.visit(s.url(p.path))
		for _, w := range p.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not show %q:\n%s", p.path, w, text)
			}
		}
	}

	text := b.visit(s.url("/entries/evil"))
	for _, w := range []string{"<script>alert(1)</script>", `\x1b]0;owned`, `"><img src=x onerror=alert(2)>`, "entry.paused"} {
		if !strings.Contains(text, w) {
			t.Errorf("entry page does not show %q as text:\n%s", w, text)
		}
	}

	text = b.visit(s.url("/entries/invoice-run"))
	for _, w := range []string{"*/10 * * * *", "Europe/Berlin", "entry.updated", "cron: */15 * * * * → */10 * * * *", "Next fires"} {
		if !strings.Contains(strings.ReplaceAll(text, "\n", " "), w) {
			t.Errorf("entry page of invoice-run does not show %q:\n%s", w, text)
		}
	}
	b.screenshot("console-entry.png")

	text = b.visit(s.url("/forecast"))
	for _, w := range []string{"40 entries", "00:00", "Hint:", "reports", "billing"} {
		if !strings.Contains(text, w) {
			t.Errorf("forecast does not show %q:\n%s", w, text)
		}
	}
	b.screenshot("console-forecast.png")
}
