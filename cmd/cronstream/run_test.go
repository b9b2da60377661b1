package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// logValue returns the value of key in the first JSON log line of stderr
// whose msg is msg.
func logValue(stderr, msg, key string) (string, bool) {
	for _, l := range strings.Split(stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != msg {
			continue
		}
		if v, ok := m[key].(string); ok {
			return v, true
		}
	}
	return "", false
}

func httpStatus(url string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestRun(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	env := append(baseEnv(), "CRONSTREAM_NATS="+n.URL(), "CRONSTREAM_REDIS="+r.URL)
	e := &cliEnv{t: t, nats: n, redis: r, vars: env}

	p := start(t, env, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "test-replica")
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address")
	base := "http://" + addr
	if code := httpStatus(base + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus(base+"/readyz") == http.StatusOK }, "/readyz never answered 200:\n%s", p.Stderr())

	e.ok("entry", "put", "tick", "--cron", "@every 1s", "--type", "tick")
	ins := inspector(t, r.URL)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 2 }, "no tasks fired into Redis")

	// status sees the replica, ready.
	var st statusJSON
	e.okJSON(&st, "status", "--json")
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "test-replica" || st.Replicas[0].Ready != "yes" {
		t.Errorf("status replicas: %+v", st.Replicas)
	}
	if code := httpStatus(base + "/metrics"); code != http.StatusOK {
		t.Errorf("/metrics = %d", code)
	}

	// Readiness follows Redis.
	r.Stop(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus(base+"/readyz") == http.StatusServiceUnavailable }, "/readyz still 200 with Redis down")
	r.Start(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus(base+"/readyz") == http.StatusOK }, "/readyz not back to 200 after Redis returned")
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 1 }, "no tasks fired after Redis returned")

	// SIGTERM while firing every second: exit 0, promptly.
	began := time.Now()
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d on SIGTERM\n%s", code, p.Stderr())
	}
	t.Logf("run stopped %s after SIGTERM", time.Since(began).Round(time.Millisecond))

	// Its heartbeat is gone at once, not after the expiry.
	e.okJSON(&st, "status", "--json")
	if len(st.Replicas) != 0 {
		t.Errorf("stopped replica still listed: %+v", st.Replicas)
	}

	// Nothing lost: every task in Redis has its fired event in the stream
	// (the outbox was flushed at shutdown).
	fired := map[string]bool{}
	for _, l := range parseAudit(t, e.ok("audit", "--json", "--type", "entry.fired")) {
		var d struct {
			TaskID string `json:"task_id"`
		}
		if err := json.Unmarshal(l.Data, &d); err != nil {
			t.Fatal(err)
		}
		fired[d.TaskID] = true
	}
	tasks := pendingTasks(t, ins, "default")
	if len(tasks) == 0 {
		t.Fatal("no tasks left to check")
	}
	for _, task := range tasks {
		if !fired[task.ID] {
			t.Errorf("task %s is in Redis without a fired event", task.ID)
		}
	}
}
