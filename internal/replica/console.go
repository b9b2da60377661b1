package replica

import (
	"context"
	"slices"
	"strings"

	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/stall"
)

// mountConsole serves the read-only console at / on the HTTP server; it
// shows "starting" until attachConsole.
func (r *Replica) mountConsole(h *httpServer) error {
	cfg := *r.cfg.Console
	if cfg.Logger == nil {
		cfg.Logger = r.log
	}
	c, err := console.New(cfg)
	if err != nil {
		_ = h.ln.Close() // not serving yet
		return err
	}
	r.console = c
	h.mount("/", c)
	r.log.Info("serving the console", "url", "http://"+h.Addr()+"/", "payloads", cfg.Payloads, "token", cfg.Token != "")
	return nil
}

// attachConsole gives the console this replica's projection, members,
// stall detector and outbox once they run.
func (r *Replica) attachConsole() {
	if r.console == nil {
		return
	}
	r.console.Attach(console.Source{
		Names:       r.cfg.Names,
		JS:          r.js,
		Entries:     r.proj.States,
		LastSeq:     r.proj.LastSeq,
		Quarantined: r.proj.Quarantined,
		Late:        func() []stall.Late { return r.stall.Late(1000) },
		Backlog:     r.relay.Backlog,
		Tasks:       r.store,
		Replicas: func(context.Context) ([]console.Replica, error) {
			m := r.members
			m.mu.RLock()
			out := make([]console.Replica, 0, len(m.live))
			for _, i := range m.live {
				out = append(out, console.Replica{ID: i.ID, Host: i.Host, HTTP: i.HTTP, Started: i.Started, Beat: i.Beat, ConfigSeq: i.ConfigSeq, Warnings: i.Warnings})
			}
			m.mu.RUnlock()
			slices.SortFunc(out, func(a, b console.Replica) int { return strings.Compare(a.ID, b.ID) })
			return out, nil
		},
	})
}
