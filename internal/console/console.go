// Package console serves cronstream's read-only web console: the entries,
// their configuration history, the configuration as of any moment, the fire
// forecast and the audit log, as server-rendered HTML.
//
// Everything shown comes from entries anyone allowed to publish config
// events wrote, so every value is hostile input: pages are html/template
// (which escapes by context), charts are SVG built by the same templates,
// there is no inline script, and a strict Content-Security-Policy keeps
// the browser to same-origin assets embedded in the binary. No request
// changes cronstream's state: pages are GET and HEAD; the only POSTs sign
// a browser in and out (session.go), refused from other origins.
package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures the console; the zero value hides payloads and needs no
// token.
type Config struct {
	// Payloads shows task payloads and headers (hidden by default: they may
	// hold data the people who can reach the console should not read).
	Payloads bool
	// Token, when set, is required: as "Authorization: Bearer <token>", or
	// the session cookie the /login form sets (session.go).
	Token string
	// SessionTTL is how long a sign-in lasts (default DefaultSessionTTL).
	SessionTTL time.Duration
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Replica is one replica as the overview shows it: what `cronstream
// status` shows of it, from the same reading (replica.ReadStatuses).
type Replica struct {
	ID      string
	Host    string
	Version string
	HTTP    string
	Started time.Time
	// BeatAge is how long ago its last heartbeat was written ("1.8s").
	BeatAge string
	// ConfigSeq is the last config sequence its projection applied.
	ConfigSeq uint64
	// Ready is its /readyz answer: "yes", "no: <failed checks>" or
	// "unknown".
	Ready    string
	Warnings []string
	// Shards says it is of a build that owns shards; Ownership is its
	// last report of them (shardview.Collect joins it with the leases).
	Shards    bool
	Ownership *shardview.Report
}

// Source is what the console reads, from a running replica. Every field
// but Names and JS may be nil.
type Source struct {
	Names events.Names
	JS    jetstream.JetStream
	// Entries returns the live projection's entries in any order; the
	// console only reads them (Projector.States).
	Entries func() []*projector.State
	// LastSeq is the projection's last applied config sequence.
	LastSeq  func() uint64
	Replicas func(ctx context.Context) ([]Replica, error)
	Late     func() []stall.Late
	// Backlog is the outbox backlog: records written to Redis, not yet
	// published to the activity stream.
	Backlog     func() int64
	Quarantined func() []projector.Quarantine
	// Tasks reads asynq task state from Redis: the states of an entry's
	// recent tasks, the per-queue counts and the fires counters of
	// limited entries.
	Tasks *taskstate.Store
	// Now is the replicas' clock (corrected to Redis TIME), which decides
	// when an entry has ended; default Config.Now.
	Now func() time.Time
}

// Console is the console's HTTP handler. It serves a "starting" page until
// Attach gives it a source.
type Console struct {
	cfg      Config
	src      atomic.Pointer[Source]
	pages    map[string]*template.Template
	static   fs.FS
	mux      *http.ServeMux
	sessions *sessions // nil without a token
	// csrf refuses the sign-in and sign-out POSTs of other origins.
	csrf *http.CrossOriginProtection

	snapMu  sync.Mutex
	snap    []*projector.State
	snapSeq uint64

	fcMu    sync.Mutex
	fcCache map[fcKey]*forecastView
}

// New builds a console.
func New(cfg Config) (*Console, error) {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, DefaultSessionTTL)
	c := &Console{cfg: cfg, pages: map[string]*template.Template{}, fcCache: map[fcKey]*forecastView{}, csrf: http.NewCrossOriginProtection()}
	if cfg.Token != "" {
		s, err := newSessions(cfg.Token, cfg.SessionTTL, cfg.Now)
		if err != nil {
			return nil, fmt.Errorf("console sessions: %w", err)
		}
		c.sessions = s
	}
	for _, p := range []string{"overview", "entries", "entry", "timetravel", "forecast", "audit", "message", "login"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/svg.html", "templates/table.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", p, err)
		}
		c.pages[p] = t
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.static = sub
	c.mux = http.NewServeMux()
	c.mux.HandleFunc("/{$}", c.overview)
	c.mux.HandleFunc("/entries", c.entries)
	c.mux.HandleFunc("/entries/{id}", c.entry)
	c.mux.HandleFunc("/timetravel", c.timeTravel)
	c.mux.HandleFunc("/forecast", c.forecast)
	c.mux.HandleFunc("/audit", c.audit)
	c.mux.HandleFunc("/login", c.login)
	c.mux.HandleFunc("/logout", c.logout)
	c.mux.HandleFunc("/static/", c.staticFile)
	c.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.message(w, r, http.StatusNotFound, "Not found", "There is no page at this address.")
	})
	return c, nil
}

// Attach gives the console what it shows.
func (c *Console) Attach(src Source) { c.src.Store(&src) }

// csp allows same-origin scripts, styles and images only: no inline script
// or style, no plug-ins, no framing, forms only to this origin.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if _, err := r.Cookie(legacyTokenCookie); err == nil {
		// Builds before sessions kept the token itself in this cookie:
		// make the browser forget it.
		http.SetCookie(w, &http.Cookie{Name: legacyTokenCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	signInOut := r.URL.Path == "/login" || r.URL.Path == "/logout"
	switch {
	case r.Method == http.MethodPost && signInOut:
		if err := c.csrf.Check(r); err != nil {
			http.Error(w, "sign-in and sign-out come from this console's own pages: "+err.Error(), http.StatusForbidden)
			return
		}
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "the console is read-only: only GET and HEAD (and the sign-in form's POST)", http.StatusMethodNotAllowed)
		return
	}
	if c.cfg.Token != "" && !signInOut && !strings.HasPrefix(r.URL.Path, "/static/") && !c.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="cronstream console"`)
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Data: localPath(r.URL.RequestURI())})
		return
	}
	c.mux.ServeHTTP(w, r)
}

// staticFile serves an embedded asset by name, and nothing for a
// directory: no listing, of this or any folder.
func (c *Console) staticFile(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/static/")
	if fs.ValidPath(name) && name != "." {
		if st, err := fs.Stat(c.static, name); err == nil && !st.IsDir() {
			http.ServeFileFS(w, r, c.static, name)
			return
		}
	}
	c.message(w, r, http.StatusNotFound, "Not found", "There is no file at this address.")
}

// page is what every template gets.
type page struct {
	Title string
	Nav   string
	Now   time.Time
	Live  bool // the page asks live.js to refresh its live parts
	Error string
	Data  any
	// SignedIn: the request carries a session cookie, so the page offers
	// to sign out.
	SignedIn bool
}

func (c *Console) source(w http.ResponseWriter, r *http.Request) (*Source, bool) {
	src := c.src.Load()
	if src == nil {
		c.message(w, r, http.StatusServiceUnavailable, "Starting", "The replica is starting: its projection is not loaded yet. This page refreshes when you reload it.")
		return nil, false
	}
	return src, true
}

// now is the time on the replicas' clock.
func (c *Console) now(src *Source) time.Time {
	if src.Now != nil {
		return src.Now().UTC()
	}
	return c.cfg.Now().UTC()
}

func (c *Console) message(w http.ResponseWriter, r *http.Request, code int, title, text string) {
	c.render(w, r, code, "message", page{Title: title, Data: text})
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, errBadRequest) {
		code = http.StatusBadRequest
	} else {
		c.cfg.Logger.Warn("console page failed", "path", r.URL.Path, "err", err)
	}
	c.message(w, r, code, http.StatusText(code), err.Error())
}

var errBadRequest = errors.New("bad request")

func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, name string, p page) {
	p.Now = c.cfg.Now().UTC()
	p.Nav = cmp.Or(p.Nav, name)
	p.SignedIn = c.signedIn(r)
	t := c.pages[name]
	var b strings.Builder
	if err := t.Execute(&b, p); err != nil {
		c.cfg.Logger.Error("console template", "page", name, "err", err)
		http.Error(w, "template error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(b.String()))
	}
}
