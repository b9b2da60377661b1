package asynqcompat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
)

// DefaultSchedulerOwner is the owner label of the entries a Scheduler
// registers when SchedulerOpts.Owner is empty.
const DefaultSchedulerOwner = "asynqcompat-scheduler"

// DefaultSource is the CloudEvents source of the config events this
// package publishes when SchedulerOpts.Source is empty.
const DefaultSource = "cronstream/asynqcompat"

// SchedulerOpts are a Scheduler's options: what of asynq.SchedulerOpts
// means something here, and where its entries go. The zero value is the
// default.
//
// asynq.SchedulerOpts fields that have no counterpart: HeartbeatInterval
// (the cronstream replicas list the entries for `asynq cron ls` and
// asynqmon themselves), LogLevel (give Logger a handler with a level),
// PreEnqueueFunc, PostEnqueueFunc and EnqueueErrorHandler (tasks are
// enqueued by the replicas, not by this process: read what fired, and
// what was skipped and why, from the activity stream with package audit).
type SchedulerOpts struct {
	// Location is each entry's time zone: its cron spec is evaluated
	// there, as asynq's scheduler evaluates specs in its Location (nil:
	// UTC, asynq's default). It must be an IANA zone (time.LoadLocation);
	// time.Local is refused, since every replica would read it as its own
	// host's zone.
	Location *time.Location
	// Prefix is the cronstream tenant (--prefix; default "cronstream").
	Prefix string
	// Owner labels every entry this registers (default
	// DefaultSchedulerOwner; the manager's default is another). Unregister
	// removes only entries of this owner, and `cronstream entry ls
	// --owner` lists them.
	Owner string
	// Source is the CloudEvents source of the published events, which
	// the audit log shows as who changed the entry (default DefaultSource).
	Source string
	// Logger receives what the manager logs (default slog.Default());
	// a Scheduler logs nothing: its calls return their errors.
	Logger *slog.Logger
	// Timeout bounds Register and Unregister, which take no context
	// (default 30s). RegisterContext and UnregisterContext use theirs.
	Timeout time.Duration
}

// Scheduler registers periodic tasks with cronstream the way
// asynq.Scheduler registers them with itself: Register(cronspec, task,
// opts...) and Unregister(entryID). Instead of running timers it publishes
// each registration as a config event; every cronstream replica then fires
// the entry into Redis as an ordinary asynq task, exactly once per tick
// however many replicas and however many of your processes run.
//
// Unlike asynq's, a registration is stored, not held in memory:
//
//   - It fires as soon as Register returns, whether or not Start is
//     called, and keeps firing after the process exits. Shutdown removes
//     nothing; Unregister does.
//   - The entry id is derived from the registration (see Register), so
//     the same registration in every process, and after every restart,
//     is one entry with one history, not a new UUID each time.
//
// A Scheduler is safe for concurrent use.
type Scheduler struct {
	client  *events.Client
	js      jetstream.JetStream
	names   events.Names
	owner   string
	zone    string
	timeout time.Duration

	streamsMu sync.Mutex
	streamsOK bool

	startMu  sync.Mutex
	started  bool
	shutdown bool
}

// NewScheduler returns a Scheduler publishing through js. It fails on
// options that cannot work (time.Local, a bad prefix); it does not reach
// NATS until the first call that needs it.
func NewScheduler(js jetstream.JetStream, opts *SchedulerOpts) (*Scheduler, error) {
	if js == nil {
		return nil, errors.New("asynqcompat: JetStream is nil")
	}
	o := SchedulerOpts{}
	if opts != nil {
		o = *opts
	}
	zone, err := zoneName(o.Location)
	if err != nil {
		return nil, err
	}
	names, err := events.NewNames(o.Prefix)
	if err != nil {
		return nil, fmt.Errorf("asynqcompat: prefix: %w", err)
	}
	return &Scheduler{
		client:  events.NewClient(js, names, events.WithSource(cmp.Or(o.Source, DefaultSource))),
		js:      js,
		names:   names,
		owner:   cmp.Or(o.Owner, DefaultSchedulerOwner),
		zone:    zone,
		timeout: cmp.Or(max(o.Timeout, 0), 30*time.Second),
	}, nil
}

// zoneName is the IANA name of loc ("UTC" for nil).
func zoneName(loc *time.Location) (string, error) {
	if loc == nil {
		return events.DefaultTimezone, nil
	}
	name := loc.String()
	if loc == time.Local || name == "Local" {
		return "", errors.New("asynqcompat: Location time.Local is each replica's own host zone; give an IANA zone (time.LoadLocation(\"Europe/Berlin\"))")
	}
	if _, err := time.LoadLocation(name); err != nil {
		return "", fmt.Errorf("asynqcompat: Location %q is not an IANA zone every replica can load (time.FixedZone is not): %w", name, err)
	}
	return name, nil
}

// Register registers task to be enqueued on the schedule cronspec and
// returns the entry's id, as asynq.Scheduler.Register does, with these
// differences:
//
//   - The id is derived from the registration (the task type made
//     readable and a hash of spec, type, payload, headers and options;
//     internal/asynqconv.EntryID), or given with EntryID. Registering the
//     same thing again returns the same id and publishes nothing.
//   - Options given to asynq.NewTask apply first, as in asynq. Every asynq
//     v0.26.0 option converts, or is refused with an error naming it
//     (ErrUnsupportedOption: TaskID, ProcessAt, ProcessIn, an absolute
//     Deadline; see this package's Deadline for a relative one).
//   - cronspec is any cronstream spec (a superset of asynq's: six fields
//     with seconds are accepted too); @every counts from the Unix epoch,
//     not from registration (docs/migrating-from-asynq.md).
//   - An entry paused by an operator stays paused; anything else about it
//     is as registered.
func (s *Scheduler) Register(cronspec string, task *asynq.Task, opts ...asynq.Option) (entryID string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	return s.RegisterContext(ctx, cronspec, task, opts...)
}

// RegisterContext is Register bounded by ctx.
func (s *Scheduler) RegisterContext(ctx context.Context, cronspec string, task *asynq.Task, opts ...asynq.Option) (string, error) {
	e, err := entryOf(cronspec, task, opts, s.zone)
	if err != nil {
		return "", err
	}
	if err := s.put(ctx, e); err != nil {
		return "", err
	}
	return e.ID, nil
}

// entryOf converts a registration into the entry it becomes in zone.
func entryOf(cronspec string, task *asynq.Task, opts []asynq.Option, zone string) (events.Entry, error) {
	r, err := newRegistration(cronspec, task, opts)
	if err != nil {
		return events.Entry{}, err
	}
	e, err := r.conv.Entry()
	if err != nil {
		return events.Entry{}, fmt.Errorf("asynqcompat: register %q %q: %w", cronspec, task.Type(), err)
	}
	if r.id != "" {
		e.ID = r.id
	}
	e.Timezone = zone
	if err := configure(&e, r.configure); err != nil {
		return events.Entry{}, err
	}
	if err := e.Validate(); err != nil {
		return events.Entry{}, fmt.Errorf("asynqcompat: register %q %q: %w", cronspec, task.Type(), err)
	}
	return e, nil
}

// configure applies the Configure options and refuses changes to what the
// registration itself says.
func configure(e *events.Entry, fs []func(*events.Entry)) error {
	if len(fs) == 0 {
		return nil
	}
	before := e.Clone()
	for _, f := range fs {
		f(e)
	}
	kept := e.Clone()
	kept.ID, kept.Cron, kept.Timezone, kept.Task, kept.Options = before.ID, before.Cron, before.Timezone, before.Task, before.Options
	kept.Owner, kept.Paused, kept.Note, kept.Removed = before.Owner, before.Paused, before.Note, before.Removed
	if !events.SameContent(kept, *e) {
		return errors.New("asynqcompat: Configure changed the id, cron spec, timezone, task, asynq options, owner or pause state; " +
			"those come from the registration (EntryID, the spec, the task, the options, SchedulerOpts)")
	}
	return nil
}

// ensureStreams creates the streams when no replica has yet, once; it never
// changes existing ones (their settings are `cronstream streams apply`'s).
func (s *Scheduler) ensureStreams(ctx context.Context) error {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streamsOK {
		return nil
	}
	if err := createStreams(ctx, s.js, s.names); err != nil {
		return err
	}
	s.streamsOK = true
	return nil
}

func createStreams(ctx context.Context, js jetstream.JetStream, names events.Names) error {
	if _, err := events.SyncStreams(ctx, js, events.StreamConfig{Names: names}, events.CreateMissing); err != nil {
		return fmt.Errorf("asynqcompat: create the streams: %w", err)
	}
	return nil
}

// conflictRounds bounds the read-plan-write rounds of one put when other
// writers keep changing the entry.
const conflictRounds = 5

// put publishes e as the scheduler owner's, through configsync's plan: only a
// difference is published, conditional on the revision read, and an
// operator's pause is kept.
func (s *Scheduler) put(ctx context.Context, e events.Entry) error {
	if err := s.ensureStreams(ctx); err != nil {
		return err
	}
	c, owner := s.client, s.owner
	for round := 1; ; round++ {
		var cur []events.Current
		got, rev, err := c.Get(ctx, e.ID)
		switch {
		case err == nil:
			cur = []events.Current{{ID: e.ID, Revision: rev, Entry: got}}
		case errors.Is(err, events.ErrMalformedEvent):
			// Quarantined: the plan repairs it, conditional on its revision.
			if cs, lerr := c.History(ctx, e.ID); lerr == nil && len(cs) > 0 {
				cur = []events.Current{{ID: e.ID, Revision: cs[len(cs)-1].Seq, Err: err}}
			}
		case !errors.Is(err, events.ErrNotFound):
			return fmt.Errorf("asynqcompat: read entry %q: %w", e.ID, err)
		}
		plan := configsync.MakePlan(cur, []configsync.Config{{Entry: e, Owner: &owner}}, owner, false)
		_, err = configsync.Apply(ctx, c, plan)
		if err == nil {
			return nil
		}
		if !errors.Is(err, events.ErrRevisionConflict) || round == conflictRounds {
			return fmt.Errorf("asynqcompat: register entry %q: %w", e.ID, err)
		}
	}
}

// Unregister removes a registered entry by its id: it stops firing on
// every replica. As with asynq, an id this scheduler does not know is an
// error: one that does not exist (it wraps events.ErrNotFound) or whose
// entry belongs to another owner.
func (s *Scheduler) Unregister(entryID string) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	return s.UnregisterContext(ctx, entryID)
}

// UnregisterContext is Unregister bounded by ctx.
func (s *Scheduler) UnregisterContext(ctx context.Context, entryID string) error {
	e, rev, err := s.client.Get(ctx, entryID)
	if err != nil {
		return fmt.Errorf("asynqcompat: unregister %q: %w", entryID, err)
	}
	if e.Owner != s.owner {
		return fmt.Errorf("asynqcompat: unregister %q: the entry belongs to owner %q, not to this scheduler's %q", entryID, e.Owner, s.owner)
	}
	if _, err := s.client.Remove(ctx, entryID, events.IfRevision(rev)); err != nil {
		return fmt.Errorf("asynqcompat: unregister %q: %w", entryID, err)
	}
	return nil
}

// Start checks that NATS answers and the streams exist (creating them if
// no replica has yet). There is nothing to run: the replicas fire the
// entries. As with asynq, it fails once the scheduler was started or shut
// down.
func (s *Scheduler) Start() error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	switch {
	case s.shutdown:
		return errors.New("asynqcompat: the scheduler has already been stopped")
	case s.started:
		return errors.New("asynqcompat: the scheduler is already running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := s.ensureStreams(ctx); err != nil {
		return err
	}
	s.started = true
	return nil
}

// Run calls Start and then waits for SIGTERM or SIGINT, as asynq's Run
// does, so a program whose main ended in scheduler.Run() keeps its shape.
func (s *Scheduler) Run() error {
	if err := s.Start(); err != nil {
		return err
	}
	waitForSignals()
	s.Shutdown()
	return nil
}

// Shutdown marks the scheduler stopped. It removes nothing: the entries
// are stored in the config stream and keep firing; Unregister removes one.
func (s *Scheduler) Shutdown() {
	s.startMu.Lock()
	s.shutdown = true
	s.startMu.Unlock()
}

// Ping checks that the config stream answers.
func (s *Scheduler) Ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if _, err := s.js.Stream(ctx, s.names.ConfigStream()); err != nil {
		return fmt.Errorf("asynqcompat: config stream %s: %w", s.names.ConfigStream(), err)
	}
	return nil
}

// waitForSignals blocks until SIGTERM or SIGINT.
func waitForSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(ch)
	<-ch
}
