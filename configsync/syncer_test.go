package configsync

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// testCtx ends with the test, bounded so a hang fails instead of stalling.
func testCtx(t testing.TB) context.Context { return testenv.Context(t, 30*time.Second) }

func newClient(t *testing.T) *events.Client {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	names := events.MustNames("cs")
	if err := events.EnsureStreams(testCtx(t), js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	return events.NewClient(js, names, events.WithSource("configsync/test"))
}

// switchable is a provider whose answer the test changes.
type switchable struct {
	mu   sync.Mutex
	cfgs []Config
	err  error
}

func (s *switchable) set(cfgs []Config, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfgs, s.err = cfgs, err
}

func (s *switchable) GetConfigs() ([]Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfgs, s.err
}

func TestSyncOnce(t *testing.T) {
	ctx := testCtx(t)
	c := newClient(t)
	prov := &switchable{}
	s := &Syncer{Provider: prov, Client: c, Prune: true}

	prov.set([]Config{{Entry: entry("a", "@daily")}, {Entry: entry("b", "@hourly")}}, nil)
	r, err := s.SyncOnce(ctx)
	if err != nil || r.Plan.Count(Create) != 2 {
		t.Fatalf("first sync: %v plan %v", err, kinds(r.Plan))
	}
	a, revA, err := c.Get(ctx, "a")
	if err != nil || a.Owner != DefaultOwner {
		t.Fatalf("a = %+v, %v; want owner %q", a, err, DefaultOwner)
	}

	// Same configs again: nothing published.
	r, err = s.SyncOnce(ctx)
	if err != nil || !r.Plan.Empty() || len(r.Plan.Unchanged) != 2 {
		t.Fatalf("second sync: %v plan %v unchanged %v", err, kinds(r.Plan), r.Plan.Unchanged)
	}
	if _, rev, _ := c.Get(ctx, "a"); rev != revA {
		t.Errorf("an unchanged sync moved a from revision %d to %d", revA, rev)
	}

	// A manual entry and a manual pause survive syncs.
	if _, err := c.Put(ctx, entry("manual", "@daily")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, "a", "incident"); err != nil {
		t.Fatal(err)
	}
	prov.set([]Config{{Entry: entry("a", "@hourly")}}, nil) // b dropped, a changed
	if r, err = s.SyncOnce(ctx); err != nil {
		t.Fatalf("third sync: %v", err)
	}
	if got := kinds(r.Plan); len(got) != 2 || got[0] != "~a" || got[1] != "-b" {
		t.Errorf("third plan %v", got)
	}
	a, _, _ = c.Get(ctx, "a")
	if a.Cron != "@hourly" || !a.Paused || a.Note != "incident" {
		t.Errorf("a after sync = cron %q paused %v note %q; want the new cron and the manual pause kept", a.Cron, a.Paused, a.Note)
	}
	if _, _, err := c.Get(ctx, "b"); !errors.Is(err, events.ErrNotFound) {
		t.Errorf("b not pruned: %v", err)
	}
	if _, _, err := c.Get(ctx, "manual"); err != nil {
		t.Errorf("manual entry pruned: %v", err)
	}

	// A provider error and an invalid config both keep everything.
	list := func() []events.Current {
		cur, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return cur
	}
	before := list()
	prov.set(nil, errors.New("database down"))
	if _, err := s.SyncOnce(ctx); err == nil {
		t.Errorf("provider error not reported")
	}
	prov.set([]Config{{Entry: entry("c", "@daily")}, {Entry: events.Entry{ID: "d", Cron: "bad"}}}, nil)
	if _, err := s.SyncOnce(ctx); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("invalid configs: %v, want ErrInvalidConfig", err)
	}
	after := list()
	if len(after) != len(before) {
		t.Errorf("entries changed by failed syncs: %d → %d", len(before), len(after))
	}
	for i := range before {
		if before[i].Revision != after[i].Revision {
			t.Errorf("%s moved from revision %d to %d", before[i].ID, before[i].Revision, after[i].Revision)
		}
	}
}

// TestApplyConflict: a plan made from a state someone changed meanwhile
// is refused with a conflict, never overwrites.
func TestApplyConflict(t *testing.T) {
	ctx := testCtx(t)
	c := newClient(t)
	if _, err := c.Put(ctx, owned(entry("a", "@daily"), "sync")); err != nil {
		t.Fatal(err)
	}
	cur, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan := MakePlan(cur, []Config{{Entry: entry("a", "@hourly")}, {Entry: entry("b", "@daily")}}, "sync", false)
	// Someone changes a after the plan was made.
	if _, err := c.Put(ctx, owned(entry("a", "*/5 * * * *"), "sync")); err != nil {
		t.Fatal(err)
	}
	outs, err := Apply(ctx, c, plan)
	if !errors.Is(err, events.ErrRevisionConflict) {
		t.Fatalf("Apply = %v, want a revision conflict", err)
	}
	if len(outs) != 2 || outs[0].Err == nil || outs[1].Err != nil || !outs[1].Published {
		t.Errorf("outcomes %+v: want a refused, b registered", outs)
	}
	a, _, _ := c.Get(ctx, "a")
	if a.Cron != "*/5 * * * *" {
		t.Errorf("the concurrent change was overwritten: cron %q", a.Cron)
	}
}

func TestSyncerRun(t *testing.T) {
	c := newClient(t)
	prov := &switchable{}
	prov.set([]Config{{Entry: entry("a", "@daily")}}, nil)
	reports := make(chan Report, 100)
	s := &Syncer{Provider: prov, Client: c, Interval: 20 * time.Millisecond, Owner: "team",
		OnSync: func(r Report) { reports <- r }}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	next := func() Report {
		t.Helper()
		select {
		case r := <-reports:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no sync reported")
		}
		return Report{}
	}
	if r := next(); r.Err != nil || r.Plan.Count(Create) != 1 {
		t.Fatalf("first sync %+v", r)
	}
	prov.set(nil, errors.New("unavailable"))
	// A sync that began before the provider failed may report first.
	for r := next(); r.Err == nil; r = next() {
		if r.Plan.Count(Create) != 0 {
			t.Fatalf("sync after the first created again: %+v", r)
		}
	}
	prov.set([]Config{{Entry: entry("a", "@hourly")}}, nil)
	testenv.Eventually(t, 10*time.Second, func() bool {
		e, _, err := c.Get(testCtx(t), "a")
		return err == nil && e.Cron == "@hourly" && e.Owner == "team"
	}, "the syncer did not publish the provider's change")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	if err := (&Syncer{}).Run(context.Background()); err == nil {
		t.Errorf("Run without a provider succeeded")
	}
}

var _ ConfigProvider = FileProvider{}
