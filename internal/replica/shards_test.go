package replica

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// readyzFailed returns the checks /readyz names as failing, with their
// reasons (nil when it answers ready or not at all).
func readyzFailed(addr string) map[string]string {
	_, body := readyz(addr)
	var r struct {
		Failed map[string]string `json:"failed"`
	}
	_ = json.Unmarshal([]byte(body), &r)
	return r.Failed
}

// TestUnownedShardsReported: the one replica that may own a queue's shards
// is cut off from NATS while another replica, which may own none (not
// ready), records in Redis that it hears NATS. The cut-off replica stops
// renewing, so its leases lapse and nobody takes them. Within a takeover's
// time of the lapse every shard counts as unowned, in
// cronstream_shards_unowned, in its report (what its heartbeat carries to
// status) with the reason, and in status's reading of the leases, with one
// log line, and the replica counts none as owned; /readyz fails check
// `shards` only once they have had no owner for --late-after, naming why.
// Healed, it takes the shards back and all of it clears.
func TestUnownedShardsReported(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
	names := events.MustNames("unowned")
	const lateAfter = 5 * time.Second
	r, addr, logs, _ := runWatched(t, Config{NATSURL: "nats://" + proxy.Addr(), NATSOptions: []nats.Option{nats.IgnoreDiscoveredServers()},
		Redis: rd.Client(t), Names: names, ReplicaID: "r1", LateAfter: lateAfter})
	own := r.owner.Load()
	ctx := context.Background()
	// An entry that will not fire during the test: its queue gives the
	// replica shards to own.
	entry := events.Entry{ID: "hourly", Cron: "0 * * * *", Task: events.Task{Type: "work"}}
	if _, err := events.NewClient(ns.JetStream(t), names).Put(ctx, entry); err != nil {
		t.Fatal(err)
	}
	queue := entry.Options.QueueName()
	testenv.Eventually(t, 20*time.Second, func() bool { return own.Report().Owned == events.ShardsPerQueue }, "r1 to own every shard: %+v", own.Report())
	unowned := func() float64 { return metricValue(t, addr, "cronstream_shards_unowned") }
	if n := unowned(); n != 0 {
		t.Fatalf("cronstream_shards_unowned = %v with every shard owned", n)
	}

	store := taskstate.New(rd.Client(t))
	stopHearing := make(chan struct{})
	var hearing sync.WaitGroup
	hearing.Add(1)
	go func() {
		defer hearing.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			// What a replica's ownership records at each lease poll.
			_ = store.NoteNATSHeard(ctx, names.Prefix(), "not-ready", time.Now())
			select {
			case <-stopHearing:
				return
			case <-tick.C:
			}
		}
	}()
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopHearing); hearing.Wait() }) }
	t.Cleanup(stop)

	cut := time.Now()
	proxy.Cut(testenv.Drop)
	// Heard last at the cut; renewals stop NATSLostAfter later, the last
	// lease lapses a term after its renewal, and a free shard counts as
	// unowned after one step per candidate and a poll. The rest is slack
	// for a loaded machine.
	bound := ownership.DefaultNATSLostAfter + ownership.DefaultLeaseTTL + ownership.DefaultTakeoverStep + 2*ownership.DefaultLeasePoll
	// allOwned is the start of the last read that found every shard
	// owned: the shards went unowned after it, however late this test's
	// reads come on a loaded machine.
	allOwned := cut
	testenv.Eventually(t, bound+5*time.Second, func() bool {
		at := time.Now()
		n := unowned()
		if n == 0 {
			allOwned = at
		}
		return n == events.ShardsPerQueue
	}, "cronstream_shards_unowned to count every shard: %v", lazy(func() string { return shardReport(own) }))
	seen := time.Now()
	t.Logf("every shard unowned %s after the cut", seen.Sub(cut).Round(100*time.Millisecond))
	if why, failed := readyzFailed(addr)["shards"]; failed {
		t.Errorf("/readyz fails check shards at once, before --late-after: %s", why)
	}
	rep := own.Report()
	if rep.UnownedCount != events.ShardsPerQueue || rep.Desired != events.ShardsPerQueue || rep.Owned != 0 || !strings.Contains(rep.Problem, "cut off from NATS") {
		t.Errorf("r1's report while cut off: %+v", rep)
	}
	if n := metricValue(t, addr, "cronstream_shards_owned"); n != 0 {
		t.Errorf("cronstream_shards_owned = %v with every lease lapsed", n)
	}
	view, warnings := shardview.Collect(ctx, store, names.Prefix(), []string{queue}, nil)
	if view.UnownedCount != events.ShardsPerQueue || !strings.Contains(strings.Join(warnings, "\n"), "have no owner") {
		t.Errorf("status reads %d unowned shards, warnings %q", view.UnownedCount, warnings)
	}

	var why string
	testenv.Eventually(t, lateAfter+5*time.Second, func() bool {
		why = readyzFailed(addr)["shards"]
		return why != ""
	}, "/readyz to fail check shards: %v", lazy(func() string { _, b := readyz(addr); return b }))
	if waited := time.Since(allOwned); waited < lateAfter-time.Second {
		t.Errorf("/readyz failed check shards %s after the last read that found every shard owned, before --late-after (%s)", waited, lateAfter)
	}
	if !strings.Contains(why, "have had no owner") || !strings.Contains(why, "cut off from NATS") || !strings.Contains(why, queue+"/") {
		t.Errorf("/readyz check shards says %q", why)
	}

	proxy.Heal()
	stop()
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := readyz(addr)
		return code == http.StatusOK && unowned() == 0 && own.Report().Owned == events.ShardsPerQueue
	}, "r1 to own every shard and be ready again: %v; /readyz %v", lazy(func() string { return shardReport(own) }), lazy(func() string { _, b := readyz(addr); return b }))
	if rep := own.Report(); rep.UnownedCount != 0 || rep.Problem != "" {
		t.Errorf("r1's report after the heal: %+v", rep)
	}
	if n := strings.Count(logs.String(), "shards have no owner"); n != 1 {
		t.Errorf("%d log lines saying shards have no owner, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "every shard has an owner again") {
		t.Errorf("no log line for the end of it:\n%s", logs)
	}
}

func shardReport(own *ownership.Manager) string {
	b, _ := json.Marshal(own.Report())
	return string(b)
}
