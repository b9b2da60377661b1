package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestStatusShowsUnresponsiveReplica: a replica frozen with SIGSTOP stops
// beating without removing its heartbeat. Within three heartbeats status
// shows it as unresponsive, with its last beat, for
// replica.DefaultUnresponsiveFor after that beat (it does not vanish as it
// did when its key expired with the staleness bound), and the other
// replica counts it out of the live replicas it hashes entries over: it
// becomes the primary of every entry (with --metrics-per-entry each
// entry's series comes from its primary alone). Resumed with SIGCONT, it
// is live again.
func TestStatusShowsUnresponsiveReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	var ids []string
	var file strings.Builder
	file.WriteString("entries:\n")
	for i := range 24 {
		id := fmt.Sprintf("entry-%02d", i)
		ids = append(ids, id)
		fmt.Fprintf(&file, "  - id: %s\n    cron: \"@every 1h\"\n    task: {type: t}\n", id)
	}
	e.ok("sync", "-f", writeFile(t, "schedules.yaml", file.String()))
	_, baseA := startMetricsReplica(t, e, "alive", "--metrics-per-entry")
	frozen, baseB := startMetricsReplica(t, e, "frozen", "--metrics-per-entry")
	t.Cleanup(func() {
		_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
		_ = frozen.cmd.Process.Kill()
	})
	type replicaState struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		BeatAge string `json:"beat_age"`
		Ready   string `json:"ready"`
	}
	statusOf := func() map[string]replicaState {
		var st struct {
			Replicas []replicaState `json:"replicas"`
		}
		e.okJSON(&st, "status", "--json")
		out := map[string]replicaState{}
		for _, r := range st.Replicas {
			out[r.ID] = r
		}
		return out
	}
	series := func(base string) int { return len(entrySeries(base, "cronstream_entry_next_fire_timestamp_seconds")) }
	testenv.Eventually(t, 20*time.Second, func() bool {
		st := statusOf()
		return st["alive"].State == "live" && st["frozen"].State == "live" && series(baseA)+series(baseB) == len(ids) && series(baseB) > 0
	}, "both replicas never live, sharing the entries: %v; series %v", lazy(func() string { return fmt.Sprint(statusOf()) }), lazy(func() string { return fmt.Sprint(series(baseA), series(baseB)) }))

	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	testenv.Eventually(t, 20*time.Second, func() bool { return statusOf()["frozen"].State == "unresponsive" }, "frozen never shown unresponsive: %v", lazy(func() string { return fmt.Sprint(statusOf()) }))
	st := statusOf()
	age, err := time.ParseDuration(st["frozen"].BeatAge)
	if err != nil || age < 6*time.Second || age > time.Since(frozenAt)+2*time.Second || !strings.Contains(st["frozen"].Ready, "unresponsive") {
		t.Fatalf("frozen replica: %+v (frozen %s ago)", st["frozen"], time.Since(frozenAt))
	}
	if st["alive"].State != "live" {
		t.Fatalf("alive replica: %+v", st["alive"])
	}
	text := e.ok("status")
	if !strings.Contains(text, "Replicas: 1 live, 1 unresponsive") || !strings.Contains(text, "frozen") {
		t.Fatalf("status text:\n%s", text)
	}
	// The live one is every entry's primary now.
	testenv.Eventually(t, 20*time.Second, func() bool { return series(baseA) == len(ids) }, "alive is not the primary of every entry: %v series", lazy(func() string { return fmt.Sprint(series(baseA)) }))
	// Still listed well after the staleness bound (the bucket keeps it
	// for DefaultUnresponsiveFor).
	deadline := frozenAt.Add(15 * time.Second)
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Now().After(deadline) }, "")
	if st := statusOf(); st["frozen"].State != "unresponsive" {
		t.Fatalf("15s after it froze: %+v, want listed as unresponsive for %s", st["frozen"], replica.DefaultUnresponsiveFor)
	}

	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v\nthe frozen replica's stderr:\n%s", err, frozen.Stderr())
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return statusOf()["frozen"].State == "live" }, "never live again after SIGCONT: %v", lazy(func() string { return fmt.Sprint(statusOf()) }))
}
