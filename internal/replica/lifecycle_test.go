package replica

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/failpause"
	"github.com/cronstream/cronstream/internal/keygc"
	"github.com/cronstream/cronstream/internal/lifecycle"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/recoverer"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/projector"
)

// component is the lifecycle every long-running part of a replica has.
type component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// TestComponentLifecycles walks each component a replica runs through the
// rules of package lifecycle (tested there on the helper itself): Stop
// before Start returns nil and a Start after it ErrStopped; a second Start
// returns ErrAlreadyStarted; Stop twice returns nil, and Start after Stop
// ErrStopped.
func TestComponentLifecycles(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	rc := testenv.StartRedis(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := events.MustNames("lc")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	kv, err := OpenReplicasBucket(ctx, js, names, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	store := taskstate.New(rc)
	client := events.NewClient(js, names)
	log := quietLogger()
	// What the components that follow others follow.
	proj, err := projector.New(projector.Config{JS: js, Names: names, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proj.Stop(context.Background()) })
	members, err := NewMembership(MembershipConfig{KV: kv, JS: js, Self: Info{ID: "members"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := members.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = members.Stop(context.Background()) })

	made := 0
	for _, tc := range []struct {
		name string
		make func() (component, error)
	}{
		{"projector", func() (component, error) {
			return projector.New(projector.Config{JS: js, Names: names, Logger: log})
		}},
		{"membership", func() (component, error) {
			made++
			return NewMembership(MembershipConfig{KV: kv, JS: js, Self: Info{ID: fmt.Sprintf("m%d", made)}, Logger: log})
		}},
		{"relay", func() (component, error) {
			return relay.New(relay.Config{Outbox: store, JS: js, Names: names, Owner: "lc", Logger: log})
		}},
		{"recoverer", func() (component, error) {
			return recoverer.New(recoverer.Config{Redis: rc, Names: names, ReplicaID: "lc", Interval: time.Hour, Logger: log})
		}},
		{"stall", func() (component, error) {
			return stall.New(stall.Config{Watermarks: store, Projection: proj, Names: names, Logger: log})
		}},
		{"keygc", func() (component, error) {
			return keygc.New(keygc.Config{Store: store, Removals: client, Projection: proj, Names: names, Interval: time.Hour, Logger: log})
		}},
		{"failpause", func() (component, error) {
			return failpause.New(failpause.Config{Store: store, Projection: proj, Entries: client, Names: names, Logger: log})
		}},
		{"scheduler", func() (component, error) {
			return scheduler.New(scheduler.Config{Redis: rc, Projection: proj, Names: names, ReplicaID: "lc", Logger: log})
		}},
		{"ownership", func() (component, error) {
			return ownership.New(ownership.Config{Store: store, Members: members, Names: names, ReplicaID: "members", Queues: proj.Queues, Logger: log})
		}},
	} {
		t.Run(tc.name+"/stop before start", func(t *testing.T) {
			c, err := tc.make()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Stop(ctx); err != nil {
				t.Fatalf("Stop before Start = %v", err)
			}
			if err := c.Start(ctx); !errors.Is(err, lifecycle.ErrStopped) {
				t.Fatalf("Start after Stop = %v, want ErrStopped", err)
			}
		})
		t.Run(tc.name+"/start twice, stop twice", func(t *testing.T) {
			c, err := tc.make()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); !errors.Is(err, lifecycle.ErrAlreadyStarted) {
				_ = c.Stop(ctx)
				t.Fatalf("second Start = %v, want ErrAlreadyStarted", err)
			}
			for i := range 2 {
				if err := c.Stop(ctx); err != nil {
					t.Fatalf("Stop %d = %v", i+1, err)
				}
			}
			if err := c.Start(ctx); !errors.Is(err, lifecycle.ErrStopped) {
				t.Fatalf("Start after Stop = %v, want ErrStopped", err)
			}
		})
	}
}
