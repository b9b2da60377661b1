package asynqcompat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
)

// DefaultManagerOwner is the owner label of a PeriodicTaskManager's entries
// when its SchedulerOpts.Owner is empty.
const DefaultManagerOwner = "asynqcompat-manager"

// DefaultSyncInterval is how often a PeriodicTaskManager polls its provider
// when SyncInterval is zero: asynq's default.
const DefaultSyncInterval = 3 * time.Minute

// PeriodicTaskManagerOpts configure a PeriodicTaskManager, as
// asynq.PeriodicTaskManagerOpts do; JetStream takes the place of
// RedisConnOpt and RedisUniversalClient.
type PeriodicTaskManagerOpts struct {
	// PeriodicTaskConfigProvider is required: the whole wanted set of
	// periodic tasks, asked for at start and on every poll.
	PeriodicTaskConfigProvider asynq.PeriodicTaskConfigProvider
	// JetStream is required: where the config events go.
	JetStream jetstream.JetStream
	// SchedulerOpts: Location (each entry's time zone), Prefix, Owner
	// (default DefaultManagerOwner), Source and Logger.
	*SchedulerOpts
	// SyncInterval between polls (default DefaultSyncInterval).
	SyncInterval time.Duration
}

// PeriodicTaskManager keeps the entries of its owner equal to what an
// asynq.PeriodicTaskConfigProvider returns, as asynq's PeriodicTaskManager
// keeps its scheduler's: at Start and on every poll it publishes the
// difference as config events (configsync's plan), and the cronstream
// replicas fire the entries.
//
// It differs from asynq's where storing the configuration demands it:
//
//   - It manages the entries of its owner only, and removes those of its
//     owner that the provider no longer returns (stale entries) at Start
//     and on every poll, also ones a previous run of the program left. It
//     never removes anything at Shutdown: the entries outlive the process,
//     and the replicas keep firing them while it restarts. Give each
//     program its own SchedulerOpts.Owner.
//   - A config that does not convert (an option it cannot carry, an
//     invalid spec) skips the whole poll and keeps the current entries;
//     asynq registers the others. The poll's error is logged, and Start
//     returns the first poll's.
//   - The same registration returned twice is one entry (asynq would fire
//     it twice).
//   - An entry paused by an operator stays paused across polls.
type PeriodicTaskManager struct {
	syncer   configsync.Syncer
	js       jetstream.JetStream
	names    events.Names
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	state   managerState
	cancel  context.CancelFunc
	stopped chan struct{}
}

type managerState int

const (
	managerNew managerState = iota
	managerRunning
	managerClosed
)

// NewPeriodicTaskManager returns a manager; it does not reach NATS before
// Start.
func NewPeriodicTaskManager(opts PeriodicTaskManagerOpts) (*PeriodicTaskManager, error) {
	if opts.PeriodicTaskConfigProvider == nil {
		return nil, errors.New("asynqcompat: PeriodicTaskConfigProvider cannot be nil")
	}
	if opts.JetStream == nil {
		return nil, errors.New("asynqcompat: JetStream cannot be nil")
	}
	so := SchedulerOpts{}
	if opts.SchedulerOpts != nil {
		so = *opts.SchedulerOpts
	}
	zone, err := zoneName(so.Location)
	if err != nil {
		return nil, err
	}
	names, err := events.NewNames(so.Prefix)
	if err != nil {
		return nil, fmt.Errorf("asynqcompat: prefix: %w", err)
	}
	if opts.SyncInterval < 0 {
		return nil, fmt.Errorf("asynqcompat: SyncInterval %s is negative", opts.SyncInterval)
	}
	log := cmp.Or(so.Logger, slog.Default())
	m := &PeriodicTaskManager{
		js: opts.JetStream, names: names, log: log,
		interval: cmp.Or(opts.SyncInterval, DefaultSyncInterval),
	}
	m.syncer = configsync.Syncer{
		Provider: providerConfigs{p: opts.PeriodicTaskConfigProvider, zone: zone},
		Client:   events.NewClient(opts.JetStream, names, events.WithSource(cmp.Or(so.Source, DefaultSource))),
		Owner:    cmp.Or(so.Owner, DefaultManagerOwner),
		Prune:    true,
	}
	return m, nil
}

// Start syncs once, and returns that sync's error (the provider failed, a
// config does not convert, NATS did not answer) without starting anything
// else, as asynq's Start returns its initial sync's. Then it polls every
// SyncInterval until Shutdown.
func (m *PeriodicTaskManager) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.state {
	case managerRunning:
		return errors.New("asynqcompat: the manager is already running")
	case managerClosed:
		return errors.New("asynqcompat: the manager has already been stopped")
	}
	first, cancelFirst := context.WithTimeout(context.Background(), time.Minute)
	defer cancelFirst()
	if err := createStreams(first, m.js, m.names); err != nil {
		return err
	}
	r, err := m.syncer.SyncOnce(first)
	if err != nil {
		return fmt.Errorf("asynqcompat: initial sync: %w", err)
	}
	m.report(r)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.stopped, m.state = cancel, make(chan struct{}), managerRunning
	go m.loop(ctx)
	return nil
}

// loop polls until ctx ends. It is configsync.Syncer.Run without Run's
// first sync, which Start made.
func (m *PeriodicTaskManager) loop(ctx context.Context) {
	defer close(m.stopped)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, err := m.syncer.SyncOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.log.Error("asynqcompat: sync failed; the entries stay as they were", "owner", m.syncer.Owner, "err", err)
			continue
		}
		m.report(r)
	}
}

func (m *PeriodicTaskManager) report(r configsync.Report) {
	if r.Plan.Empty() {
		return
	}
	m.log.Info("asynqcompat: synced", "owner", m.syncer.Owner, "created", r.Plan.Count(configsync.Create),
		"updated", r.Plan.Count(configsync.Update), "removed", r.Plan.Count(configsync.Remove))
}

// Shutdown stops polling and waits for a poll in flight to end. It removes
// no entry: they keep firing.
func (m *PeriodicTaskManager) Shutdown() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == managerRunning {
		m.cancel()
		<-m.stopped
	}
	m.state = managerClosed
}

// Run calls Start, waits for SIGTERM or SIGINT, and shuts down, as asynq's
// Run does.
func (m *PeriodicTaskManager) Run() error {
	if err := m.Start(); err != nil {
		return err
	}
	waitForSignals()
	m.Shutdown()
	return nil
}

// providerConfigs is an asynq provider as a configsync.ConfigProvider: the
// manager's configs converted to entries in zone.
type providerConfigs struct {
	p    asynq.PeriodicTaskConfigProvider
	zone string
}

// GetConfigs converts every config; any that does not makes the whole set
// invalid (configsync.ErrInvalidConfig), listing each problem.
func (pc providerConfigs) GetConfigs() ([]configsync.Config, error) {
	cfgs, err := pc.p.GetConfigs()
	if err != nil {
		return nil, err
	}
	var problems []configsync.Problem
	out := make([]configsync.Config, 0, len(cfgs))
	index := map[string]int{} // entry id → position in out
	for i, c := range cfgs {
		name := fmt.Sprintf("configs[%d]", i)
		e, err := configEntry(c, pc.zone)
		if err != nil {
			problems = append(problems, configsync.Problem{Entry: name, Message: err.Error()})
			continue
		}
		if j, dup := index[e.ID]; dup {
			if !events.SameContent(out[j].Entry, e) {
				problems = append(problems, configsync.Problem{Entry: name, Message: fmt.Sprintf("entry id %q is also another config's, with other content", e.ID)})
			}
			continue // the same registration twice is one entry
		}
		index[e.ID] = len(out)
		out = append(out, configsync.Config{Entry: e})
	}
	if len(problems) > 0 {
		return nil, &configsync.InvalidError{Source: "the PeriodicTaskConfigProvider's configs", Problems: problems}
	}
	return out, nil
}

// configEntry converts one config, refusing what asynq's manager refuses.
func configEntry(c *asynq.PeriodicTaskConfig, zone string) (events.Entry, error) {
	switch {
	case c == nil:
		return events.Entry{}, errors.New("PeriodicTaskConfig cannot be nil")
	case c.Task == nil:
		return events.Entry{}, errors.New("PeriodicTaskConfig.Task cannot be nil")
	case c.Cronspec == "":
		return events.Entry{}, errors.New("PeriodicTaskConfig.Cronspec cannot be empty")
	}
	return entryOf(c.Cronspec, c.Task, c.Opts, zone)
}
