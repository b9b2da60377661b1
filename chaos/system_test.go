package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// prefix is the tenant prefix of every test system (each test has its own
// servers, so they never meet).
const prefix = "chaos"

// systemConfig describes the processes of one test system.
type systemConfig struct {
	// replicaNATS is each replica's --nats value; its length is the number
	// of replicas.
	replicaNATS []string
	// adminNATS is what the test and the CLI connect to.
	adminNATS      string
	js             jetstream.JetStream
	redis          *testenv.Redis
	streamReplicas int
	maxStaleness   time.Duration
	workers        int
	queues         []string
	seed           uint64
	// clockOffsets, when set, runs replica i with its local clock off by
	// clockOffsets[i] (--test-clock-offset; zero: the right clock).
	clockOffsets []time.Duration
}

// system is the processes of one test: cronstream replicas and asynq
// workers, with their logs in one directory.
type system struct {
	t     *testing.T
	dir   string
	cfg   systemConfig
	bin   string
	names events.Names
	rdb   *redis.Client
	js    jetstream.JetStream
	http  *http.Client

	replicas []*replicaProc
	workers  []*proc

	// onReady, when set, learns when each replica run first answered
	// /readyz 200 (the chaos timeline).
	onReady func(replica, gen int, at time.Time)

	watchers  sync.WaitGroup
	stopWatch chan struct{}
}

type replicaProc struct {
	*proc
	id   string
	addr string // HTTP host:port
	// freeze is the file whose presence freezes the replica's view of
	// the others (--test-freeze-view: the split-view fault).
	freeze string
}

func newSystem(t *testing.T, cfg systemConfig) *system {
	t.Helper()
	bin, workerBin := buildBinaries(t)
	s := &system{
		t: t, dir: logDir(t), cfg: cfg, bin: bin,
		names: events.MustNames(prefix),
		rdb:   cfg.redis.Client(t),
		js:    cfg.js,
		// No keep-alive: no idle connection goroutines for goleak to find.
		http:      &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		stopWatch: make(chan struct{}),
	}
	for i, natsURL := range cfg.replicaNATS {
		addr := freeAddr(t)
		id := fmt.Sprintf("r%d", i)
		args := []string{"run",
			"--nats", natsURL, "--redis", cfg.redis.URL, "--prefix", prefix,
			"--replicas", strconv.Itoa(cfg.streamReplicas), "--replica-id", id,
			"--http", addr, "--recover-interval", "1s", "--recover-grace", "3s",
			"--log-format", "json"}
		if cfg.maxStaleness > 0 {
			args = append(args, "--max-staleness", cfg.maxStaleness.String())
		}
		if i < len(cfg.clockOffsets) && cfg.clockOffsets[i] != 0 {
			args = append(args, "--test-clock-offset", cfg.clockOffsets[i].String())
		}
		freeze := filepath.Join(s.dir, id+".freeze")
		args = append(args, "--test-freeze-view", freeze)
		s.replicas = append(s.replicas, &replicaProc{proc: newProc(id, bin, filepath.Join(s.dir, id+".log"), args...), id: id, addr: addr, freeze: freeze})
	}
	for i := range cfg.workers {
		name := fmt.Sprintf("w%d", i)
		s.workers = append(s.workers, newProc(name, workerBin, filepath.Join(s.dir, name+".log"),
			"--redis", cfg.redis.Addr, "--queues", strings.Join(cfg.queues, ","),
			"--log", s.workerLog(i), "--concurrency", "150",
			"--seed", strconv.FormatUint(cfg.seed+uint64(i), 10)))
	}
	t.Cleanup(s.cleanup)
	t.Logf("process logs in %s", s.dir)
	return s
}

// workerLog is worker i's start/end log (see testdata/worker).
func (s *system) workerLog(i int) string {
	return filepath.Join(s.dir, fmt.Sprintf("w%d.tasks", i))
}

func (s *system) cleanup() {
	close(s.stopWatch)
	failed := s.t.Failed()
	if failed {
		for i, r := range s.replicas {
			if !r.running() {
				continue
			}
			code, body := s.readyz(i)
			s.t.Logf("--- %s at failure: /readyz %d %s\n%s", r.name, code, body, s.metricLines(i, "cronstream_"))
		}
	}
	var wg sync.WaitGroup
	for _, r := range s.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if failed {
				// A goroutine dump into the replica's log, for diagnosis.
				r.signal(syscall.SIGQUIT, 5*time.Second)
				return
			}
			r.signalWait(5 * time.Second)
		}()
	}
	for _, w := range s.workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.signalWait(5 * time.Second) }()
	}
	wg.Wait()
	s.watchers.Wait()
	if s.t.Failed() {
		for _, r := range s.replicas {
			s.t.Logf("--- %s log tail (%s) ---\n%s", r.name, r.logPath, r.tail(40))
		}
		for _, w := range s.workers {
			s.t.Logf("--- %s log tail (%s) ---\n%s", w.name, w.logPath, w.tail(20))
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// startReplica starts replica i and watches for its first ready answer.
func (s *system) startReplica(i int) {
	s.t.Helper()
	r := s.replicas[i]
	if err := r.start(); err != nil {
		s.t.Fatalf("%v", err)
	}
	gen, _ := r.generation()
	s.watchers.Add(1)
	go s.watchReady(i, gen)
}

// watchReady polls replica i's /readyz until run gen answers 200 (then
// reports it through onReady), the run ends, or the system stops.
func (s *system) watchReady(i, gen int) {
	defer s.watchers.Done()
	r := s.replicas[i]
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.stopWatch:
			return
		case <-tick.C:
		}
		g, up := r.generation()
		if !up || g != gen {
			return
		}
		if code, _ := s.readyz(i); code == http.StatusOK {
			if s.onReady != nil {
				s.onReady(i, gen, time.Now())
			}
			return
		}
	}
}

func (s *system) startWorker(i int) {
	s.t.Helper()
	if err := s.workers[i].start(); err != nil {
		s.t.Fatalf("%v", err)
	}
}

// readyz returns replica i's /readyz status code and body (0 when it does
// not answer).
func (s *system) readyz(i int) (int, string) {
	resp, err := s.http.Get("http://" + s.replicas[i].addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitReady waits until every replica answers /readyz with 200.
func (s *system) waitReady(timeout time.Duration) {
	s.t.Helper()
	last := map[int]string{}
	testenv.Eventually(s.t, timeout, func() bool {
		ok := true
		for i := range s.replicas {
			code, body := s.readyz(i)
			if code != http.StatusOK {
				last[i] = fmt.Sprintf("%d %s", code, body)
				ok = false
			} else {
				delete(last, i)
			}
		}
		return ok
	}, "every replica ready (not ready: %v)", lazy(func() string { return fmt.Sprint(last) }))
}

// metrics scrapes replica i's /metrics and sums each metric's series.
func (s *system) metrics(i int) (map[string]float64, error) {
	resp, err := s.http.Get("http://" + s.replicas[i].addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name := line[:sp]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// metricLines returns replica i's metric lines whose names start with
// prefix, for failure messages.
func (s *system) metricLines(i int, prefix string) string {
	resp, err := s.http.Get("http://" + s.replicas[i].addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) && !strings.Contains(line, "_bucket{") {
			out = append(out, "    "+line)
		}
	}
	return strings.Join(out, "\n")
}

// metric is one summed metric of replica i (-1 when it cannot be read).
func (s *system) metric(i int, name string) float64 {
	m, err := s.metrics(i)
	if err != nil {
		return -1
	}
	return m[name]
}

// totalFires sums cronstream_fires_total over the replicas that answer.
func (s *system) totalFires() float64 {
	var sum float64
	for i := range s.replicas {
		if v := s.metric(i, "cronstream_fires_total"); v > 0 {
			sum += v
		}
	}
	return sum
}

// cli runs the cronstream CLI against the system.
func (s *system) cli(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := append([]string{}, args...)
	all = append(all, "--nats", s.cfg.adminNATS, "--redis", s.cfg.redis.URL, "--prefix", prefix)
	cmd := exec.CommandContext(ctx, s.bin, all...)
	cmd.Env = childEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("cronstream %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// entryIDs names n entries: e000, e001, ...
func entryIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("e%03d", i)
	}
	return ids
}

// queueOf spreads entries over the queues.
func queueOf(i int, queues []string) string { return queues[i%len(queues)] }

// registerEntries publishes the entries ("@every 1s", retention 1h so every
// completed task stays countable) with the Go client.
func (s *system) registerEntries(ids []string) {
	s.t.Helper()
	c := events.NewClient(s.js, s.names, events.WithSource("chaos-test"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, id := range ids {
		e := events.Entry{
			ID: id, Cron: "@every 1s",
			Task:    events.Task{Type: "chaos:tick", Payload: []byte(`{"entry":"` + id + `"}`)},
			Options: events.Options{Queue: queueOf(i, s.cfg.queues), Retention: events.Duration(time.Hour)},
		}
		if _, err := c.Put(ctx, e); err != nil {
			s.t.Fatalf("register entry %s: %v", id, err)
		}
	}
}

// pauseEntries pauses every entry, so nothing fires any more and the state
// can settle for counting.
func (s *system) pauseEntries(ids []string) {
	s.t.Helper()
	c := events.NewClient(s.js, s.names, events.WithSource("chaos-test"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range ids {
		if _, err := c.Pause(ctx, id, "chaos: counting"); err != nil {
			s.t.Fatalf("pause entry %s: %v", id, err)
		}
	}
}

// statusReport is the part of `cronstream status --json` the tests read.
type statusReport struct {
	Replicas []struct {
		ID    string `json:"id"`
		Ready string `json:"ready"`
	} `json:"replicas"`
	Entries struct {
		Active      int `json:"active"`
		Paused      int `json:"paused"`
		Quarantined int `json:"quarantined"`
	} `json:"entries"`
	Outbox struct {
		Backlog int64 `json:"backlog"`
	} `json:"outbox"`
}

func (s *system) status() (statusReport, error) {
	out, err := s.cli("status", "--json")
	if err != nil {
		return statusReport{}, err
	}
	var rep statusReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return statusReport{}, fmt.Errorf("status --json: %w: %s", err, out)
	}
	return rep, nil
}

// lazy defers formatting a failure message to when it is printed.
type lazy func() string

func (f lazy) String() string { return f() }
