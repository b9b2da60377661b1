package configsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cronstream/cronstream/events"
)

// DefaultInterval is how often a Syncer syncs when no interval is given
// (asynq's PeriodicTaskManager syncs every 3 minutes; config as code is
// expected to show up sooner).
const DefaultInterval = time.Minute

// Outcome is what applying one Action did.
type Outcome struct {
	Action Action
	// Revision is the entry's revision after the write.
	Revision uint64
	// Published says an event was published (false when a concurrent
	// writer had already made the same change).
	Published bool
	Err       error
}

// Apply publishes the actions of p, each conditional on the revision the
// plan was made from, so a change made meanwhile by someone else is
// reported as a conflict (events.ErrRevisionConflict) rather than
// overwritten. It applies every action it can and returns the failures
// joined.
func Apply(ctx context.Context, c *events.Client, p Plan) ([]Outcome, error) {
	out := make([]Outcome, 0, len(p.Actions))
	var errs []error
	for _, a := range p.Actions {
		o := Outcome{Action: a}
		var res events.Result
		switch a.Kind {
		case Create, Update:
			res, o.Err = c.Put(ctx, a.Entry, events.IfRevision(a.Revision))
		case Remove:
			res, o.Err = c.Remove(ctx, a.ID, events.IfRevision(a.Revision))
		default:
			o.Err = fmt.Errorf("unknown action %q", a.Kind)
		}
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", a.Kind, a.ID, o.Err))
		} else {
			o.Revision, o.Published = res.Revision, res.Type != ""
		}
		out = append(out, o)
		if ctx.Err() != nil {
			break
		}
	}
	return out, errors.Join(errs...)
}

// ConfigProvider supplies the wanted entries; a Syncer calls it once per
// sync. It is the successor of asynq's PeriodicTaskConfigProvider: return
// the whole wanted set every time (a database query, a file, an API).
type ConfigProvider interface {
	GetConfigs() ([]Config, error)
}

// FileProvider provides the entries of a schedules file, read anew at
// every call.
type FileProvider struct {
	Path string
	// MaxBytes refuses a larger file (0: DefaultMaxFileBytes).
	MaxBytes int64
}

// GetConfigs loads the file.
func (f FileProvider) GetConfigs() ([]Config, error) { return LoadFile(f.Path, f.MaxBytes) }

// Report is the outcome of one sync.
type Report struct {
	Plan     Plan
	Outcomes []Outcome
	// Err is why the sync did nothing (provider error, invalid configs,
	// NATS unreachable) or which writes failed.
	Err error
}

// Syncer keeps the config stream equal to what a ConfigProvider returns:
// it syncs at once and then every Interval until its context ends.
//
// A provider error or an invalid set of configs skips the sync and keeps
// the current configuration (asynq's rule: one invalid config stops the
// sync). Each sync publishes only the difference (see MakePlan for the
// ownership and pause rules).
type Syncer struct {
	Provider ConfigProvider
	Client   *events.Client
	// Owner labels every entry the syncer writes (default DefaultOwner);
	// Prune removes entries of this owner that the provider no longer
	// returns.
	Owner string
	Prune bool
	// Selector, when not empty, narrows every sync to the entries whose
	// labels match it (see Select).
	Selector events.Selector
	// Interval between syncs (default DefaultInterval).
	Interval time.Duration
	Logger   *slog.Logger
	// OnSync, when set, receives the report of every sync.
	OnSync func(Report)
	// MaxRemovals, when above 0, bounds the entries one sync may remove:
	// a plan that would remove more is not applied (ErrTooManyRemovals),
	// and the current entries are kept. A provider that suddenly returns
	// far fewer configs (a truncated file, an empty answer) then costs a
	// failed sync, not the entries.
	MaxRemovals int
}

// ErrTooManyRemovals is a sync refused because its plan removes more
// entries than Syncer.MaxRemovals allows.
var ErrTooManyRemovals = errors.New("the plan removes more entries than allowed")

func (s *Syncer) owner() string {
	if s.Owner == "" {
		return DefaultOwner
	}
	return s.Owner
}

// SyncOnce runs one sync: get the configs, validate them all, plan
// against the current entries, publish the plan.
func (s *Syncer) SyncOnce(ctx context.Context) (Report, error) {
	var r Report
	if s.Provider == nil || s.Client == nil {
		r.Err = errors.New("configsync: Syncer needs a Provider and a Client")
		return r, r.Err
	}
	cfgs, err := s.Provider.GetConfigs()
	switch {
	case errors.Is(err, ErrInvalidConfig):
		r.Err = fmt.Errorf("%w (nothing published, current configuration kept)", err)
		return r, r.Err
	case err != nil:
		r.Err = fmt.Errorf("config provider: %w (nothing published, current configuration kept)", err)
		return r, r.Err
	}
	if err := Validate(cfgs); err != nil {
		r.Err = fmt.Errorf("%w (nothing published, current configuration kept)", err)
		return r, r.Err
	}
	cur, err := s.Client.List(ctx)
	if err != nil {
		r.Err = err
		return r, err
	}
	cur, cfgs = Select(cur, cfgs, s.Selector)
	r.Plan = MakePlan(cur, cfgs, s.owner(), s.Prune)
	if n := r.Plan.Count(Remove); s.MaxRemovals > 0 && n > s.MaxRemovals {
		r.Err = fmt.Errorf("%w: %d, more than %d (nothing published, current configuration kept)", ErrTooManyRemovals, n, s.MaxRemovals)
		return r, r.Err
	}
	r.Outcomes, r.Err = Apply(ctx, s.Client, r.Plan)
	return r, r.Err
}

// Run syncs at once and then every Interval until ctx ends; it returns nil
// then. Failed syncs are logged (and reported to OnSync) and retried at
// the next interval.
func (s *Syncer) Run(ctx context.Context) error {
	if s.Provider == nil || s.Client == nil {
		return errors.New("configsync: Syncer needs a Provider and a Client")
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	interval := s.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := s.SyncOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			log.Error("sync failed", "owner", s.owner(), "err", err)
		} else if !r.Plan.Empty() {
			log.Info("synced", "owner", s.owner(), "created", r.Plan.Count(Create), "updated", r.Plan.Count(Update), "removed", r.Plan.Count(Remove))
		}
		if s.OnSync != nil {
			s.OnSync(r)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
