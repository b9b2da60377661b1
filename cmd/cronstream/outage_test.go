package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/schedule"
)

// TestNATSOutageKeepsFiring: every replica loses NATS, for longer than
// --max-staleness, while 200 entries fire every second. Firing goes on: the
// staleness fence compares replicas with each other and none of them hears
// the config stream (docs/design.md INV-staleness-fence), the outbox bound is
// in bytes and far from reached, and readiness says NATS is down. After the
// heal every tick of the outage has its asynq task exactly once, nothing was
// skipped, and every fired event is in the activity stream, in tick order
// per entry. The outage lasts 20 s; CRONSTREAM_OUTAGE=60s runs the long form
// of `make chaos`.
func TestNATSOutageKeepsFiring(t *testing.T) {
	t.Parallel()
	outage := 20 * time.Second
	if v := os.Getenv("CRONSTREAM_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("CRONSTREAM_OUTAGE=%q: want a positive duration", v)
		}
		outage = d
	}
	const entries = 200
	const maxStaleness = 10 * time.Second
	began := time.Now()
	phase := func(what string) { t.Logf("%s: %s", time.Since(began).Round(100*time.Millisecond), what) }
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	env := append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL)
	e := &cliEnv{t: t, nats: n, redis: r, vars: env}
	rc := r.Client(t)
	ctx := context.Background()

	var file strings.Builder
	file.WriteString("entries:\n")
	for i := range entries {
		fmt.Fprintf(&file, "  - id: outage-entry-%03d\n    cron: \"@every 1s\"\n    task: {type: outage}\n", i)
	}
	e.ok("sync", "-f", writeFile(t, "schedules.yaml", file.String()))

	// Two replicas, both cut off by the outage. The staleness bound is
	// shorter than the outage, so a fence comparing with Redis TIME (or a
	// local clock) would stop them.
	type replicaProc struct {
		id   string
		p    *proc
		base string
	}
	var reps []*replicaProc
	for _, id := range []string{"outage-a", "outage-b"} {
		p := start(t, env, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id, "--max-staleness", maxStaleness.String())
		rp := &replicaProc{id: id, p: p}
		testenv.Eventually(t, 30*time.Second, func() bool {
			addr, ok := logValue(p.Stderr(), "serving http", "addr")
			rp.base = "http://" + addr
			return ok
		}, "%s did not log its HTTP address", id)
		reps = append(reps, rp)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, rp := range reps {
				t.Logf("%s stderr:\n%s", rp.id, rp.p.Stderr())
			}
		}
	})
	for _, rp := range reps {
		testenv.Eventually(t, 60*time.Second, func() bool { return httpStatus(rp.base+"/readyz") == http.StatusOK }, "%s not ready:\n%s", rp.id, rp.p.Stderr())
	}
	pending := taskstate.Keys("default").Pending()
	testenv.Eventually(t, 60*time.Second, func() bool { return rc.LLen(ctx, pending).Val() >= 3*entries }, "the entries to fire")
	// Each holds its share before NATS goes: the membership the shares
	// follow is in NATS, so shards still being handed over stay where
	// they are through the outage.
	for _, rp := range reps {
		testenv.Eventually(t, 30*time.Second, func() bool {
			owned := metricValue(rp.base, "cronstream_shards_owned")
			return owned > 0 && owned == metricValue(rp.base, "cronstream_shards_desired")
		}, "%s to hold its share of the shards", rp.id)
	}

	down := time.Now()
	n.Shutdown()
	phase("NATS down")
	for _, rp := range reps {
		testenv.Eventually(t, 20*time.Second, func() bool {
			code, body := httpGet(rp.base + "/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, `"nats"`)
		}, "%s /readyz does not report NATS down", rp.id)
	}
	outboxKey := taskstate.Own("cronstream", "default").Outbox()
	testenv.Eventually(t, outage+30*time.Second, func() bool { return time.Since(down) >= outage }, "the outage to last %s", outage)
	// What one fire's record takes (docs/operations.md, "NATS outages"):
	// the fires of one script call share a multi-record.
	store := taskstate.New(rc)
	recs, err := store.ReadOutbox(ctx, events.DefaultPrefix, "default", "", 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	firedDown := 0
	for _, rec := range recs {
		firedDown += len(outbox.EventIDs(rec.EventID, rec.Data))
	}
	bytes, err := rc.MemoryUsage(ctx, outboxKey, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	perFire := float64(bytes) / float64(firedDown)
	t.Logf("outbox after %s without NATS: %d records of %d fires, %d bytes (MEMORY USAGE SAMPLES 0), %.0f bytes per fire", outage.Round(time.Second), len(recs), firedDown, bytes, perFire)
	if perFire > taskstate.OutboxRecordBytes {
		t.Errorf("a fire's record takes %.0f bytes, more than taskstate.OutboxRecordBytes (%d): the default bound no longer holds what docs/operations.md says", perFire, taskstate.OutboxRecordBytes)
	}
	// The default bound holds at least 30 minutes of 1,000 fires per second.
	if covers := time.Duration(float64(replica.DefaultMaxOutboxBytes)/perFire/1000) * time.Second; covers < 30*time.Minute {
		t.Errorf("--max-outbox-bytes' default holds %s of 1,000 fires per second at %.0f bytes per fire, want 30 minutes", covers, perFire)
	}
	if want := int(outage/time.Second-2) * entries; firedDown < want {
		t.Errorf("outbox holds %d fires after %s without NATS, want at least %d: firing did not go on", firedDown, outage, want)
	}
	staleRefusals := func() int {
		sum := 0
		for _, rp := range reps {
			_, metrics := httpGet(rp.base + "/metrics")
			sum += seriesValue(metrics, `cronstream_fire_refused_total{status="stale"}`)
		}
		return sum
	}
	staleDuring := staleRefusals()
	up := time.Now()
	n.Restart(t)
	t.Logf("NATS back after %s", up.Sub(down).Round(time.Millisecond))

	testenv.Eventually(t, 90*time.Second, func() bool { return rc.XLen(ctx, outboxKey).Val() == 0 }, "the outbox to drain after the heal (%d records left)", rc.XLen(ctx, outboxKey).Val())
	phase(fmt.Sprintf("outbox drained %s after the heal", time.Since(up).Round(time.Millisecond)))
	for _, rp := range reps {
		testenv.Eventually(t, 60*time.Second, func() bool { return httpStatus(rp.base+"/readyz") == http.StatusOK }, "%s not ready after the heal", rp.id)
	}
	t.Logf("fires refused as stale: %d during the outage, %d after the heal", staleDuring, staleRefusals()-staleDuring)
	// Firing stops with the replicas; their outboxes are flushed on the way.
	for _, rp := range reps {
		_, metrics := httpGet(rp.base + "/metrics")
		if v := seriesValue(metrics, "cronstream_scheduler_backpressure"); v != 0 {
			t.Errorf("%s: backpressure gauge %d", rp.id, v)
		}
		if code := rp.p.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
			t.Fatalf("%s exited %d\n%s", rp.id, code, rp.p.Stderr())
		}
		logs := rp.p.Stderr()
		if c := strings.Count(logs, `"msg":"NATS unreachable: outbox records wait in Redis until it is back"`); c != 1 {
			t.Errorf("%s logged the outage %d times, want once", rp.id, c)
		}
		if c := strings.Count(logs, `"msg":"NATS reachable again: relaying the outbox backlog"`); c != 1 {
			t.Errorf("%s logged the heal %d times, want once", rp.id, c)
		}
		if strings.Contains(logs, "firing paused") {
			t.Errorf("%s paused firing:\n%s", rp.id, logs)
		}
	}
	if left := rc.XLen(ctx, outboxKey).Val(); left != 0 {
		t.Fatalf("%d records left in the outbox", left)
	}

	phase("replicas stopped")
	// Every task once.
	ids, err := rc.LRange(ctx, pending, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	tasks := map[string]int{}
	for _, id := range ids {
		tasks[id]++
		if tasks[id] == 2 {
			t.Errorf("task %s is pending twice", id)
		}
	}

	// Every event once, in tick order per entry, only fired events.
	js := n.JetStream(t)
	c, err := js.OrderedConsumer(ctx, "CRONSTREAM_ACTIVITY", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"cronstream.fire.>"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer msgs.Stop()
	fired := map[string][]time.Time{} // entry → ticks in stream order
	seqOf := map[string]uint64{}      // event id → stream sequence, to name both ends of a disorder
	byReplica := map[string]int{}
	// Ticks skipped before the outage's checked window are the replicas'
	// start under load: registered before they ran, a tick they came to
	// later than the grace is recorded as missed, as designed.
	from, to := down.Truncate(time.Second).Add(-time.Second), up.Truncate(time.Second).Add(3*time.Second)
	startSkips := 0
	for left := info.NumPending; left > 0; left-- {
		m, err := msgs.Next(jetstream.NextMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read the activity stream (%d messages left): %v", left, err)
		}
		ev, err := events.DecodeEvent(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != events.TypeEntryFired {
			var sk events.Skipped
			if ev.Type == events.TypeEntrySkipped && ev.DecodeData(&sk) == nil && lastSkipped(sk).Before(from) {
				startSkips++
				continue
			}
			t.Errorf("%s event %s during an outage with room in Redis", ev.Type, ev.ID)
			continue
		}
		var f events.Fired
		if err := ev.DecodeData(&f); err != nil {
			t.Fatal(err)
		}
		entry, tick, ok := schedule.ParseActivityID(m.Headers().Get(jetstream.MsgIDHeader))
		if !ok || entry != f.Entry || !tick.Equal(f.ScheduledAt) {
			t.Fatalf("event %s: Nats-Msg-Id %q does not name entry %s tick %s", ev.ID, m.Headers().Get(jetstream.MsgIDHeader), f.Entry, f.ScheduledAt)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if first, dup := seqOf[ev.ID]; dup {
			t.Errorf("%s: event %s stored twice, at sequences %d and %d", entry, ev.ID, first, md.Sequence.Stream)
		}
		seqOf[ev.ID] = md.Sequence.Stream
		if ticks := fired[entry]; len(ticks) > 0 && !tick.After(ticks[len(ticks)-1]) {
			prev := ticks[len(ticks)-1]
			t.Errorf("%s: tick %s (sequence %d, %s) stored after tick %s (sequence %d)", entry, tick.Format(time.TimeOnly), md.Sequence.Stream,
				md.Timestamp.UTC().Format("15:04:05.000"), prev.Format(time.TimeOnly), seqOf[events.FiredEventID(entry, prev)])
		}
		fired[entry] = append(fired[entry], tick)
		// Past the staleness bound (and the heartbeats' lag) into the
		// outage, both replicas still fire.
		if tick.After(down.Add(maxStaleness+2*time.Second)) && tick.Before(up) {
			byReplica[f.Replica]++
		}
		if tasks[f.TaskID] != 1 {
			t.Errorf("%s: fired event for task %s, which is pending %d times", entry, f.TaskID, tasks[f.TaskID])
		}
	}
	msgs.Stop()
	t.Logf("ticks fired by replica from %s into the outage to its end: %v (%d events read)", maxStaleness+2*time.Second, byReplica, info.NumPending)
	for _, rp := range reps {
		if byReplica[rp.id] == 0 {
			t.Errorf("%s fired nothing from %s into the outage on", rp.id, maxStaleness+2*time.Second)
		}
	}
	if len(fired) != entries {
		t.Errorf("fired events of %d entries, want %d", len(fired), entries)
	}
	stored := 0
	for _, ticks := range fired {
		stored += len(ticks)
	}
	if stored != len(ids) {
		t.Errorf("%d fired events for %d pending tasks", stored, len(ids))
	}

	// No tick missed from a second before the outage to a few after it.
	t.Logf("skipped events of ticks before %s (the replicas' start): %d", from.UTC().Format(time.TimeOnly), startSkips)
	missed := 0
	for i := range entries {
		entry := fmt.Sprintf("outage-entry-%03d", i)
		for tick := from; !tick.After(to); tick = tick.Add(time.Second) {
			if tasks[schedule.TaskID("cronstream", entry, tick)] != 1 {
				missed++
				if missed <= 10 {
					t.Errorf("%s: tick %s has no task", entry, tick.UTC().Format(time.TimeOnly))
				}
			}
		}
	}
	if missed > 0 {
		t.Errorf("%d ticks between %s and %s missed", missed, from.UTC().Format(time.TimeOnly), to.UTC().Format(time.TimeOnly))
	}
}

// httpGet returns the status and body of url (0 when unreachable).
func httpGet(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue reads one sample of a Prometheus text exposition (0 when
// absent).
func seriesValue(exposition, series string) int {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(exposition)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return int(v)
}

// lastSkipped is the last tick a skipped event covers.
func lastSkipped(sk events.Skipped) time.Time {
	if sk.Until != nil {
		return *sk.Until
	}
	return sk.ScheduledAt
}
