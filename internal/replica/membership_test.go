package replica

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/cronstream/cronstream/internal/testlog"
)

// TestMembershipWaitsForLostBucket: the replicas bucket is on file, so
// a restart of NATS keeps it. Deleted, it is not made again by the
// replicas (their NATS user may not create streams): each reports the
// bucket missing (Missing, for /readyz) until `streams apply` makes it
// again; then they beat into it and follow each other again, and
// ListReplicas (what status shows) lists every replica.
func TestMembershipWaitsForLostBucket(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	names := events.MustNames("mlost")
	const hb = 200 * time.Millisecond
	apply := func(js jetstream.JetStream) jetstream.KeyValue {
		kv, err := OpenReplicasBucket(ctx, js, names, 1, DefaultUnresponsiveFor)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	start := func(id string) *Membership {
		js := ns.JetStream(t)
		m, err := NewMembership(MembershipConfig{KV: apply(js), JS: js, Self: Info{ID: id}, Interval: hb,
			Logger: testlog.Logger(t, slog.LevelDebug)})
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
			infos, err := ListReplicas(ctx, js, names)
			if err != nil {
				return false
			}
			for _, i := range infos {
				listed = append(listed, i.ID)
			}
			return slices.Equal(listed, both) && slices.Equal(a.Live(), both) && slices.Equal(b.Live(), both) &&
				heardSince(a, "b", since) && heardSince(b, "a", since) && a.Missing() == nil && b.Missing() == nil
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
	testenv.Eventually(t, 10*time.Second, func() bool { return a.Missing() != nil && b.Missing() != nil },
		"the replicas do not report the bucket missing")
	if err := a.Missing(); !strings.Contains(err.Error(), "streams apply") {
		t.Fatalf("missing: %v", err)
	}
	deadline := time.Now().Add(5 * hb)
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Now().After(deadline) }, "")
	if _, err := js.KeyValue(ctx, names.ReplicasBucket()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("a replica made the bucket again: %v", err)
	}
	// Without beats the others age out: each fires on time what it would
	// fire late (the watermark keeps each tick once).
	if !slices.Equal(a.Live(), []string{"a"}) || !slices.Equal(b.Live(), []string{"b"}) {
		t.Fatalf("without the bucket: a sees %v, b sees %v", a.Live(), b.Live())
	}
	apply(js)
	followEachOther("after streams apply made the bucket again")

	// The watch follows the new bucket, not only the last known set: a
	// clean stop is seen at once.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a"}) }, "a still sees b after its stop")
}

// newBucket starts a NATS server and opens the replicas bucket of prefix
// on it, dropping a key dropAfter after its last beat.
func newBucket(t *testing.T, prefix string, dropAfter time.Duration) (jetstream.JetStream, events.Names, jetstream.KeyValue) {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	names := events.MustNames(prefix)
	kv, err := OpenReplicasBucket(context.Background(), js, names, 1, dropAfter)
	if err != nil {
		t.Fatal(err)
	}
	return js, names, kv
}

// TestMembershipUnresponsiveReplica: a replica that stops beating without
// removing its heartbeat is live for three of its heartbeats after its
// last beat, then not (Live, which the scheduler hashes entries over), but
// still listed with its last beat until the bucket drops it; a heartbeat
// already older than that when it is first read is never live.
func TestMembershipUnresponsiveReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, names, kv := newBucket(t, "unresp", DefaultUnresponsiveFor)
	const hb = 200 * time.Millisecond
	a := mustMembership(t, MembershipConfig{KV: kv, JS: js, Self: Info{ID: "a"}, Interval: hb, Logger: quietLogger()})
	old, _ := json.Marshal(Info{ID: "old", Beat: time.Now().Add(-time.Minute), Every: hb.String()})
	if _, err := kv.Put(ctx, "old", old); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(ctx) })
	frozen, _ := json.Marshal(Info{ID: "frozen", Beat: time.Now(), Every: hb.String()})
	if _, err := kv.Put(ctx, "frozen", frozen); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a", "frozen"}) }, "frozen never live: %v", lazy(func() string { return fmt.Sprint(a.Live()) }))
	testenv.Eventually(t, 3*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a"}) }, "frozen still live: %v", lazy(func() string { return fmt.Sprint(a.Live()) }))
	infos, err := ListReplicas(ctx, js, names)
	if err != nil || len(infos) != 3 {
		t.Fatalf("listed %+v %v, want a, frozen and old", infos, err)
	}
	for _, i := range infos {
		if stale := time.Since(i.Beat) > i.StaleAfter(); stale != (i.ID != "a") {
			t.Errorf("%s: beat %s ago, stale after %s", i.ID, time.Since(i.Beat), i.StaleAfter())
		}
	}
}

// lazy is a message part computed when it is printed.
type lazy func() string

func (l lazy) String() string { return l() }

// TestMembershipBeatUsesGivenClock: a beat is stamped by the clock the
// replica passes (its Redis-corrected one), not by the host's, so a host
// whose clock is an hour off still shows a fresh beat to other readers.
func TestMembershipBeatUsesGivenClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, names, kv := newBucket(t, "mclock", time.Second)
	corrected := func() time.Time { return time.Now().Add(-time.Hour) }
	m, err := NewMembership(MembershipConfig{KV: kv, JS: js, Self: Info{ID: "skewed"}, Interval: 100 * time.Millisecond, Now: corrected})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	infos, err := ListReplicas(ctx, js, names)
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
		m, err := NewMembership(MembershipConfig{KV: kv, JS: ns.JetStream(t), Self: Info{ID: id}, Interval: time.Hour, Update: update, Logger: quietLogger()})
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

// TestMembershipFrozenView: a frozen view (the split-view fault) keeps the
// replicas it had, dead ones included, and sees no new one, while the
// replica's own beats go on; thawed, it follows the heartbeats again.
func TestMembershipFrozenView(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	names := events.MustNames("mfrozen")
	const hb = 200 * time.Millisecond
	var frozen atomic.Bool
	start := func(id string, freeze func() bool) *Membership {
		js := ns.JetStream(t)
		kv, err := OpenReplicasBucket(ctx, js, names, 1, DefaultUnresponsiveFor)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewMembership(MembershipConfig{KV: kv, JS: js, Self: Info{ID: id}, Interval: hb, Frozen: freeze,
			Logger: testlog.Logger(t, slog.LevelDebug)})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Stop(ctx) })
		return m
	}
	a := start("a", frozen.Load)
	b := start("b", nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a", "b"}) }, "a sees b (%v)", lazy(func() string { return fmt.Sprint(a.Live()) }))
	frozen.Store(true)
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	c := start("c", nil)
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Equal(c.Live(), []string{"a", "c"}) }, "c sees a (%v)", lazy(func() string { return fmt.Sprint(c.Live()) }))
	// Well past b's removal and three of c's beats: a's view has not moved.
	time.Sleep(5 * hb)
	if got := a.Live(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("frozen view: a sees %v, want still [a b]", got)
	}
	frozen.Store(false)
	testenv.Eventually(t, 10*time.Second, func() bool { return slices.Equal(a.Live(), []string{"a", "c"}) }, "thawed, a sees c and not b (%v)", lazy(func() string { return fmt.Sprint(a.Live()) }))
}

// TestBeatAgeAheadOfNow: a beat stamped a little after the reader's
// now (each clock corrected to Redis TIME within a round trip) is shown
// as fresh, not as a negative age; an old one keeps its age, and one far
// ahead shows as it is, so that a clock gone wrong is seen.
func TestBeatAgeAheadOfNow(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	infos := []Info{
		{ID: "ahead", Beat: now.Add(100 * time.Millisecond), Every: "2s"},
		{ID: "behind", Beat: now.Add(-1500 * time.Millisecond), Every: "2s"},
		{ID: "far-ahead", Beat: now.Add(time.Minute), Every: "2s"},
	}
	got := readiness(context.Background(), infos, now)
	if got[0].BeatAge != "0s" || got[0].State != StateLive {
		t.Errorf("a beat 100 ms ahead: age %s, state %s; want 0s, live", got[0].BeatAge, got[0].State)
	}
	if got[1].BeatAge != "1.5s" {
		t.Errorf("a beat 1.5 s old: age %s", got[1].BeatAge)
	}
	if got[2].BeatAge != "-1m0s" {
		t.Errorf("a beat a minute ahead: age %s, want -1m0s", got[2].BeatAge)
	}
}

// TestListReplicasWhileTheyBeat: status lists every replica while their
// heartbeats keep replacing each other in the bucket (a reader's consumer
// may report nothing left before the key whose beat was replaced under
// it comes again).
func TestListReplicasWhileTheyBeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, names, kv := newBucket(t, "mbeat", DefaultUnresponsiveFor)
	ids := []string{"r1", "r2", "r3"}
	beat := func(id string) error {
		b, err := json.Marshal(Info{ID: id, Beat: time.Now()})
		if err == nil {
			_, err = kv.Put(ctx, id, b)
		}
		return err
	}
	for _, id := range ids { // every replica has beaten once before the first list
		if err := beat(id); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	beating := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				beating <- nil
				return
			default:
			}
			if err := beat(ids[i%len(ids)]); err != nil {
				beating <- err
				return
			}
		}
	}()
	for i := range 150 {
		infos, err := ListReplicas(ctx, js, names)
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, info := range infos {
			listed = append(listed, info.ID)
		}
		if !slices.Equal(listed, ids) {
			t.Errorf("list %d: %v, want %v", i, listed, ids)
		}
	}
	close(stop)
	if err := <-beating; err != nil {
		t.Fatal(err)
	}
}
