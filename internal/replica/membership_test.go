package replica

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestMembershipSurvivesLostBucket: the replicas bucket is kept in memory,
// so a restart of NATS loses it, and an operator may delete it. Within a
// few heartbeats the replicas re-create it, beat into it and follow each
// other again: Live (what the scheduler hashes entries over) and
// ListReplicas (what status shows) both list every replica.
func TestMembershipSurvivesLostBucket(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	names := events.MustNames("mlost")
	const hb = 200 * time.Millisecond
	start := func(id string) *Membership {
		js := ns.JetStream(t)
		open := func(ctx context.Context) (jetstream.KeyValue, error) {
			return OpenReplicasBucket(ctx, js, names, 1, 3*hb)
		}
		kv, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewMembership(MembershipConfig{KV: kv, Self: Info{ID: id}, Interval: hb, Reopen: open,
			Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Stop(ctx) })
		return m
	}
	a, b := start("a"), start("b")
	js := ns.JetStream(t)
	both := []string{"a", "b"}
	// heardSince: m's watch delivered a beat of id written after since.
	heardSince := func(m *Membership, id string, since time.Time) bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		return m.live[id].Beat.After(since)
	}
	followEachOther := func(after string) {
		t.Helper()
		since := time.Now()
		var listed []string
		testenv.Eventually(t, 10*time.Second, func() bool {
			listed = listed[:0]
			kv, err := js.KeyValue(ctx, names.ReplicasBucket())
			if err != nil {
				return false
			}
			infos, err := ListReplicas(ctx, kv)
			if err != nil {
				return false
			}
			for _, i := range infos {
				listed = append(listed, i.ID)
			}
			return slices.Equal(listed, both) && slices.Equal(a.Live(), both) && slices.Equal(b.Live(), both) &&
				heardSince(a, "b", since) && heardSince(b, "a", since)
		}, "%s: %v", after, lazy(func() string {
			return fmt.Sprintf("bucket lists %v, a sees %v, b sees %v", listed, a.Live(), b.Live())
		}))
	}
	followEachOther("at start")

	ns.Restart(t)
	followEachOther("after a NATS restart")

	if err := js.DeleteKeyValue(ctx, names.ReplicasBucket()); err != nil {
		t.Fatal(err)
	}
	followEachOther("after the bucket was deleted")

	// The watch follows the new bucket, not only the last known set: a
	// clean stop is seen at once.
	b.Stop(ctx)
	testenv.Eventually(t, 2*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a"}) }, "a still sees b after its stop")
}

// testLog writes log lines to the test's log (shown when it fails).
type testLog struct{ t testing.TB }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// lazy is a message part computed when it is printed.
type lazy func() string

func (l lazy) String() string { return l() }

// TestMembershipBeatUsesGivenClock: a beat is stamped by the clock the
// replica passes (its Redis-corrected one), not by the host's, so a host
// whose clock is an hour off still shows a fresh beat to other readers.
func TestMembershipBeatUsesGivenClock(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	names := events.MustNames("mclock")
	js := ns.JetStream(t)
	kv, err := OpenReplicasBucket(ctx, js, names, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	corrected := func() time.Time { return time.Now().Add(-time.Hour) }
	m, err := NewMembership(MembershipConfig{KV: kv, Self: Info{ID: "skewed"}, Interval: 100 * time.Millisecond, Now: corrected})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	infos, err := ListReplicas(ctx, kv)
	if err != nil || len(infos) != 1 {
		t.Fatalf("ListReplicas = %v, %v", infos, err)
	}
	if age := time.Since(infos[0].Beat); age < 59*time.Minute || age > 61*time.Minute {
		t.Fatalf("beat stamped %v ago, want the given clock's time (an hour back)", age)
	}
}

// TestMembershipCandidates: only live replicas whose heartbeat says they
// own shards and are ready are candidates for shards, this one by its own
// last beat; a replica that becomes ready says so at once with Refresh,
// not at its next interval; LastBeat is when its beat was last stored.
func TestMembershipCandidates(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := OpenReplicasBucket(ctx, ns.JetStream(t), events.MustNames("mcand"), 1, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	start := func(id string, update func(*Info)) *Membership {
		m, err := NewMembership(MembershipConfig{KV: kv, Self: Info{ID: id}, Interval: time.Hour, Update: update, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Stop(ctx) })
		return m
	}
	before := time.Now()
	old := start("old", nil) // an earlier build: no shards flag
	a := start("a", func(i *Info) { i.Shards, i.Ready = true, true })
	b := start("b", func(i *Info) { i.Shards, i.Ready = true, ready.Load() })
	testenv.Eventually(t, 5*time.Second, func() bool { return len(old.Live()) == 3 && len(a.Live()) == 3 && len(b.Live()) == 3 }, "everyone live")
	for _, m := range []*Membership{old, a, b} {
		if c := m.Candidates(); !slices.Equal(c, []string{"a"}) {
			t.Errorf("candidates %v, want only a (old is of an earlier build, b not ready)", c)
		}
	}
	if at := b.LastBeat(); at.Before(before) || at.After(time.Now()) {
		t.Errorf("b's last beat at %s, started after %s", at, before)
	}
	ready.Store(true)
	b.Refresh() // the interval is an hour: only a refresh tells
	testenv.Eventually(t, 5*time.Second, func() bool {
		return slices.Equal(a.Candidates(), []string{"a", "b"}) && slices.Equal(b.Candidates(), []string{"a", "b"})
	},
		"b to be a candidate once ready: %v, %v", lazy(func() string { return strings.Join(a.Candidates(), ",") }), lazy(func() string { return strings.Join(b.Candidates(), ",") }))
}
