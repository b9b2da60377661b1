package projector

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// publishers publish valid config events from several goroutines, retrying
// each event (same Nats-Msg-Id) through outages, so the stream ends up with
// every event exactly once whatever happens to the servers.
type publishers struct {
	wg        sync.WaitGroup
	published atomic.Int64
	mu        sync.Mutex
	errs      []error
}

func startPublishers(t testing.TB, js jetstream.JetStream, workers, perWorker, entries int) *publishers {
	t.Helper()
	ctx := testCtx(t, 90*time.Second)
	ps := &publishers{}
	for w := range workers {
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for range perWorker {
				data, subject := randomValidEvent(t, r, entries)
				if err := publishRetrying(ctx, js, subject, data); err != nil {
					ps.mu.Lock()
					ps.errs = append(ps.errs, err)
					ps.mu.Unlock()
					return
				}
				ps.published.Add(1)
			}
		}()
	}
	t.Cleanup(ps.wg.Wait)
	return ps
}

func (ps *publishers) wait(t testing.TB) {
	t.Helper()
	ps.wg.Wait()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.errs) > 0 {
		t.Fatalf("publishers: %v", ps.errs)
	}
}

// randomValidEvent returns a valid config event for one of entries ids (the
// publishers share them, so their events interleave on the same entries).
func randomValidEvent(t testing.TB, r *rand.Rand, entries int) ([]byte, string) {
	id := fmt.Sprintf("c%03d", r.IntN(entries))
	e := randomEntry(r, id)
	typ := events.ConfigTypes[r.IntN(len(events.ConfigTypes))]
	switch typ {
	case events.TypeEntryPaused:
		e.Paused = true
	case events.TypeEntryRemoved:
		e.Removed = true
	}
	ev, err := events.NewEvent(typ, "test", id, e)
	if err != nil {
		t.Errorf("new event: %v", err)
		return nil, ""
	}
	b, err := ev.Marshal()
	if err != nil {
		t.Errorf("marshal event: %v", err)
	}
	return b, testNames.ConfigSubject(id)
}

// publishRetrying publishes until the stream acknowledges. The message id is
// the same on every attempt, so an attempt whose ack was lost is not stored
// twice.
func publishRetrying(ctx context.Context, js jetstream.JetStream, subject string, data []byte) error {
	ev, err := events.DecodeEvent(data)
	if err != nil {
		return err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(actx, subject, data, jetstream.WithMsgID(ev.ID))
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("publish %s: gave up: %w (last error %v)", subject, ctx.Err(), err)
		}
		// Back off briefly; the outage is what the test is about.
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// checkFollowed waits until p has applied the whole stream and checks that
// its map and its change feed equal the test's own fold of the stream.
func checkFollowed(t *testing.T, js jetstream.JetStream, p *Projector, feed *feedRecorder) {
	t.Helper()
	want, last := refFromStream(t, js)
	ctx := testCtx(t, 60*time.Second)
	if err := p.WaitFor(ctx, last); err != nil {
		t.Fatalf("wait for seq %d: %v (projector at %d, stats %+v)", last, err, p.LastSeq(), p.Stats())
	}
	if d := diffStates(t, want, stateMap(p.Entries()), p.Quarantined()); d != "" {
		t.Fatalf("projection differs from the fold of the stream:\n%s", d)
	}
	st := p.Stats()
	if st.LastSeq != last || st.Bad != 0 || st.Ignored != 0 {
		t.Fatalf("stats %+v: want last seq %d and no bad event", st, last)
	}
	feed.check(t, stateMap(p.Entries()))
	t.Logf("followed %d events; stats %+v", last, st)
}

func TestLiveFollowConcurrentPublishers(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	p := startProjector(t, n.JetStream(t), Config{})
	feed := recordFeed(t, p)
	startPublishers(t, js, 4, 100, 30).wait(t)
	checkFollowed(t, js, p, feed)
}

func TestLiveFollowAcrossServerRestart(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	// Events before the projector starts, so the restart can also land in
	// the middle of the initial load of a slow machine.
	startPublishers(t, js, 2, 50, 30).wait(t)
	p := startProjector(t, n.JetStream(t), Config{Heartbeat: 500 * time.Millisecond})
	feed := recordFeed(t, p)
	ps := startPublishers(t, js, 2, 150, 30)
	testenv.Eventually(t, 30*time.Second, func() bool { return ps.published.Load() >= 60 }, "publishers under way")
	before := ps.published.Load()
	n.Restart(t)
	t.Logf("server restarted after %d of 300 events, back at %d", before, ps.published.Load())
	ps.wait(t)
	checkFollowed(t, js, p, feed)
	if p.Err() != nil {
		t.Fatalf("projector ended: %v", p.Err())
	}
	// A restart keeps the stream: resuming, not reloading, is right.
	if st := p.Stats(); st.Reloads != 0 {
		t.Fatalf("stats %+v: a server restart made the projector reload", st)
	}
}

func TestLiveFollowAcrossStreamLeaderLoss(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs a 3-node NATS cluster and a leader loss (runs without -short, as in CI)")
	}
	c := testenv.StartNATSCluster(t, 3)
	js := c.JetStream(t)
	setupStreams(t, js, 3)
	// The projector's connection starts on the node that will be stopped, so
	// it loses its connection as well as the stream leader; it fails over to
	// the nodes the server told it about.
	leader := c.StreamLeader(t, testNames.ConfigStream())
	pjs, err := jetstream.New(c.Nodes[leader].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	p := startProjector(t, pjs, Config{Heartbeat: 500 * time.Millisecond})
	feed := recordFeed(t, p)
	ps := startPublishers(t, js, 2, 150, 30)
	testenv.Eventually(t, 30*time.Second, func() bool { return ps.published.Load() >= 60 }, "publishers under way")
	if l := c.StreamLeader(t, testNames.ConfigStream()); l != leader {
		t.Logf("stream leader moved from n%d to n%d by itself", leader, l)
		leader = l
	}
	before := ps.published.Load()
	c.StopNode(leader)
	stopped := time.Now()
	t.Logf("stream leader n%d stopped after %d of 300 events", leader, before)
	ps.wait(t)
	t.Logf("publishers done %s after the stop", time.Since(stopped))
	defer func() { t.Logf("projector caught up %s after the stop", time.Since(stopped)) }()
	if got := c.StreamLeader(t, testNames.ConfigStream()); got == leader {
		t.Fatalf("stream leader is still node %d", leader)
	}
	checkFollowed(t, js, p, feed)
	if p.Err() != nil {
		t.Fatalf("projector ended: %v", p.Err())
	}
}
