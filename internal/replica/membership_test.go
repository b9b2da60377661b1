package replica

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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
