package main

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// entrySeries reads the per-entry series of metric name from a replica's
// /metrics: entry id → value (nil: unreadable).
func entrySeries(base, name string) map[string]float64 {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+`{entry="`)
		if !ok {
			continue
		}
		id, rest, _ := strings.Cut(rest, `"`)
		_, v, _ := strings.Cut(rest, "} ")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil
		}
		out[id] = f
	}
	return out
}

// startMetricsReplica starts `run` with the given flags and returns its
// process and /metrics base URL once it is ready.
func startMetricsReplica(t *testing.T, e *cliEnv, id string, flags ...string) (*proc, string) {
	t.Helper()
	p := start(t, e.vars, append([]string{"run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", id}, flags...)...)
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "replica %s did not log its HTTP address", id)
	base := "http://" + addr
	testenv.Eventually(t, 30*time.Second, func() bool { c, _ := readyz(base); return c == http.StatusOK }, "replica %s /readyz never 200:\n%s", id, p.Stderr())
	return p, base
}

// TestMetricsPerEntry: with --metrics-per-entry each entry's last and next
// fire time is exported by exactly one of two replicas (the owner of its
// shard), the series move to the survivor when a replica stops and
// disappear when the entry is removed; without the flag there are none;
// the staleness gauge is always there.
func TestMetricsPerEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	var ids []string
	for i := range 8 {
		id := fmt.Sprintf("m%d", i)
		ids = append(ids, id)
		e.ok("entry", "put", id, "--cron", "@every 1s", "--type", "metrics", "--queue", "mq")
	}
	_, baseA := startMetricsReplica(t, e, "ma", "--metrics-per-entry")
	b, baseB := startMetricsReplica(t, e, "mb", "--metrics-per-entry")

	// Every entry on exactly one replica, both series, with a plausible
	// last fire and a next fire in the future.
	split := func(names ...string) func() bool {
		return func() bool {
			for _, name := range []string{"cronstream_entry_last_fire_timestamp_seconds", "cronstream_entry_next_fire_timestamp_seconds"} {
				sa, sb := entrySeries(baseA, name), entrySeries(baseB, name)
				if sa == nil || sb == nil {
					return false
				}
				if len(sa) == 0 || len(sb) == 0 || len(sa)+len(sb) != len(names) {
					return false
				}
				for _, id := range names {
					_, inA := sa[id]
					_, inB := sb[id]
					if inA == inB {
						return false
					}
				}
			}
			return true
		}
	}
	testenv.Eventually(t, 30*time.Second, split(ids...), "each entry's series on exactly one replica")
	now := float64(time.Now().Unix())
	for _, base := range []string{baseA, baseB} {
		for id, v := range entrySeries(base, "cronstream_entry_last_fire_timestamp_seconds") {
			if v < now-30 || v > now+5 {
				t.Errorf("%s: last fire of %s = %v, now %v", base, id, v, now)
			}
		}
		for id, v := range entrySeries(base, "cronstream_entry_next_fire_timestamp_seconds") {
			if v < now-30 || v > now+30 {
				t.Errorf("%s: next fire of %s = %v, now %v", base, id, v, now)
			}
		}
		if v := metricValue(base, "cronstream_config_staleness_seconds"); v < 0 || v > 60 {
			t.Errorf("%s: cronstream_config_staleness_seconds = %v", base, v)
		}
	}

	// A removed entry's series go.
	e.ok("entry", "rm", "m0")
	testenv.Eventually(t, 30*time.Second, split(ids[1:]...), "the removed entry's series gone, the others still split")

	// The survivor takes over the series of the stopped replica's entries.
	if code := b.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("replica mb exited %d:\n%s", code, b.Stderr())
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		for _, name := range []string{"cronstream_entry_last_fire_timestamp_seconds", "cronstream_entry_next_fire_timestamp_seconds"} {
			s := entrySeries(baseA, name)
			got := make([]string, 0, len(s))
			for id := range s {
				got = append(got, id)
			}
			slices.Sort(got)
			if !slices.Equal(got, ids[1:]) {
				return false
			}
		}
		return true
	}, "replica ma to export every remaining entry once mb stopped")

	// Without the flag: no per-entry series at all, the staleness gauge
	// still there.
	_, baseC := startMetricsReplica(t, e, "mc")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return metricValue(baseC, "cronstream_config_staleness_seconds") >= 0
	}, "replica mc to export cronstream_config_staleness_seconds")
	for _, name := range []string{"cronstream_entry_last_fire_timestamp_seconds", "cronstream_entry_next_fire_timestamp_seconds"} {
		if s := entrySeries(baseC, name); s == nil || len(s) != 0 {
			t.Errorf("without --metrics-per-entry: %s series %v", name, s)
		}
	}
}
