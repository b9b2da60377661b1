package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestFiringThroughNATSClusterRestart: a replica that became ready just
// before every node of a 3-node NATS cluster stops keeps firing while the
// nodes are down, while they boot without a quorum and once the cluster is
// healthy again: no tick of the outage or of the heal is skipped as missed
// (the chaos suite's full NATS restart, seed 1796166592023478116).
func TestFiringThroughNATSClusterRestart(t *testing.T) {
	t.Parallel()
	const entries = 20
	cluster := testenv.StartNATSCluster(t, 3)
	rd := testenv.StartRedis(t)
	env := append(baseEnv(), "CRONSTREAM_NATS="+cluster.URLs(), "CRONSTREAM_REDIS="+rd.URL)
	e := &cliEnv{t: t, redis: rd, vars: env}
	e.ok("streams", "apply", "--replicas", "3")
	var file strings.Builder
	file.WriteString("entries:\n")
	for i := range entries {
		fmt.Fprintf(&file, "  - id: restart-entry-%02d\n    cron: \"@every 1s\"\n    task: {type: restart}\n", i)
	}
	e.ok("sync", "-f", writeFile(t, "schedules.yaml", file.String()))

	run := func(id string, extra ...string) (*proc, string) {
		p := start(t, env, append([]string{"run", "--http", "127.0.0.1:0", "--log-format", "json", "--replicas", "3", "--replica-id", id}, extra...)...)
		var base string
		testenv.Eventually(t, 30*time.Second, func() bool {
			addr, ok := logValue(p.Stderr(), "serving http", "addr")
			base = "http://" + addr
			return ok
		}, "%s did not log its HTTP address", id)
		return p, base
	}
	ready := func(p *proc, base string) {
		testenv.Eventually(t, 60*time.Second, func() bool { return httpStatus(base+"/readyz") == http.StatusOK }, "replica not ready:\n%s", p.Stderr())
	}
	// r0 and r1 (its clock 20 minutes fast) fire first and are killed.
	p0, b0 := run("r0")
	p1, b1 := run("r1", "--test-clock-offset", "20m")
	ready(p0, b0)
	ready(p1, b1)
	rc := rd.Client(t)
	ctx := context.Background()
	pending := taskstate.Keys("default").Pending()
	testenv.Eventually(t, 30*time.Second, func() bool { return rc.LLen(ctx, pending).Val() >= 2*entries }, "r0 and r1 to fire")
	p0.stop(syscall.SIGKILL, 10*time.Second)
	p1.stop(syscall.SIGKILL, 10*time.Second)
	p, base := run("r2")
	ready(p, base)

	// Every node stops right after the replica became ready, as in the
	// chaos run, and the nodes boot together a few seconds later.
	down := time.Now()
	for i := range cluster.Nodes {
		cluster.StopNode(i)
	}
	// r0 and r1 start again while NATS is unreachable.
	p0, _ = run("r0")
	p1, _ = run("r1", "--test-clock-offset", "20m")
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Since(down) >= 3*time.Second }, "the outage to last 3s")
	cluster.RestartAll(t)
	healed := time.Now()
	t.Logf("NATS cluster healthy again %s after every node stopped", healed.Sub(down).Round(100*time.Millisecond))

	// Ticks from the stop to 8 s after the heal: each has its task.
	until := healed.Add(8 * time.Second).Truncate(time.Second)
	testenv.Eventually(t, 30*time.Second, func() bool { return time.Now().After(until.Add(3 * time.Second)) }, "the heal to settle")
	_, metrics := httpGet(base + "/metrics")
	var missing []string
	for tick := down.Truncate(time.Second).Add(time.Second); !tick.After(until); tick = tick.Add(time.Second) {
		n := 0
		for i := range entries {
			id := fmt.Sprintf("restart-entry-%02d", i)
			if rc.Exists(ctx, taskstate.Keys("default").Task(events.TaskID("cronstream", id, tick))).Val() == 1 {
				n++
			}
		}
		if n != entries {
			missing = append(missing, fmt.Sprintf("%s (+%s): %d of %d", tick.UTC().Format("15:04:05"), tick.Sub(down).Round(time.Second), entries-n, entries))
		}
	}
	if len(missing) > 0 {
		t.Errorf("ticks without a task (missed), relative to the NATS stop:\n  %s\nmetrics:\n%s\nreplica log:\n%s",
			strings.Join(missing, "\n  "), linesWith(metrics, "cronstream_fire", "cronstream_skipped", "cronstream_config_staleness"), p.Stderr()+"\n--- r0\n"+p0.Stderr()+"\n--- r1\n"+p1.Stderr())
	}
}
