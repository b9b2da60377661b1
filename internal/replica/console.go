package replica

import (
	"context"

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
		Now:         r.clock.Now,
		// Read as status reads them, so both show the same figures.
		Replicas: func(ctx context.Context) ([]console.Replica, error) {
			sts, err := ReadStatuses(ctx, r.js, r.cfg.Names, r.clock.Now())
			out := make([]console.Replica, len(sts))
			for i, s := range sts {
				out[i] = console.Replica{ID: s.ID, Host: s.Host, Version: s.Version, HTTP: s.HTTP, Started: s.Started,
					BeatAge: s.BeatAge, ConfigSeq: s.ConfigSeq, Ready: s.Ready, Warnings: s.Warnings, Shards: s.Shards, Ownership: s.Ownership}
			}
			return out, err
		},
	})
}
