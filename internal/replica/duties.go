package replica

import (
	"context"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/keygc"
	"github.com/cronstream/cronstream/internal/recoverer"
)

// startDuties starts the loops whose work follows the queue duties this
// replica holds (docs/design.md "Background duties"): the recoverer and
// the fail-pause scan over the queues it owns, the key sweep while it
// holds the global duty. The relay, started before the scheduler, follows
// the same duties (holdsQueue).
func (r *Replica) startDuties(ctx context.Context) error {
	var err error
	if r.recov, err = recoverer.New(recoverer.Config{
		Redis: r.cfg.Redis, Names: r.cfg.Names, ReplicaID: r.cfg.ReplicaID, Queues: r.cfg.Queues,
		Interval: r.cfg.RecoverInterval, Grace: r.cfg.RecoverGrace, OnRecord: r.relay.Notify, Now: r.clock.Now,
		Holds: r.own.HoldsQueue, Changed: r.own.Changed(),
		Logger: r.log, Metrics: recoverer.NewMetrics(r.reg),
	}); err != nil {
		return err
	}
	if err := r.recov.Start(ctx); err != nil {
		return err
	}
	if r.keygc, err = keygc.New(keygc.Config{
		Store: r.store, Removals: events.NewClient(r.js, r.cfg.Names), Projection: r.proj, Names: r.cfg.Names,
		Grace: r.cfg.RemovedKeyGrace, Interval: r.cfg.KeySweepInterval, Now: r.clock.Now, Logger: r.log, Metrics: keygc.NewMetrics(r.reg),
		Holds: r.own.HoldsGlobal,
	}); err != nil {
		return err
	}
	if err := r.keygc.Start(ctx); err != nil {
		return err
	}
	if r.failPause, err = failpause.New(failpause.Config{
		Store: r.store, Projection: r.proj, Entries: events.NewClient(r.js, r.cfg.Names, events.WithSource(events.ReplicaSource(r.cfg.ReplicaID))),
		Names: r.cfg.Names, Now: r.clock.Now, Logger: r.log, Metrics: failpause.NewMetrics(r.reg),
		Holds: r.own.HoldsQueue,
	}); err != nil {
		return err
	}
	if r.http != nil {
		r.http.addCheck("failpause", func(context.Context) error { return r.failPause.Ready() })
	}
	return r.failPause.Start(ctx)
}
