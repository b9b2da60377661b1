package systembench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// The harness shared by the benchmarks: the binary, one system (NATS,
// Redis, replica processes), and what they measure from outside (CPU from
// /proc, the activity stream, the outbox length, SLOWLOG).

var (
	buildMu  sync.Mutex
	buildDir string
	// built holds each binary built so far by name, or the error that
	// stopped its build.
	built = map[string]builtBinary{}
)

type builtBinary struct {
	path string
	err  error
}

// buildBinary builds a binary once per test process into buildDir (removed by
// TestMain), without the race detector: the benchmarks measure the
// binaries a deployment runs.
func buildBinary(b testing.TB, name string, build func(dir string) (string, error)) string {
	b.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	bin, ok := built[name]
	if !ok {
		if buildDir == "" {
			buildDir, bin.err = os.MkdirTemp("", "cronstream-systembench")
		}
		if bin.err == nil {
			bin.path, bin.err = build(buildDir)
		}
		built[name] = bin
	}
	if bin.err != nil {
		b.Fatal(bin.err)
	}
	return bin.path
}

// cronstreamBin is ./cmd/cronstream, built once per test process.
func cronstreamBin(b testing.TB) string {
	return buildBinary(b, "cronstream", func(dir string) (string, error) {
		path := filepath.Join(dir, "cronstream")
		out, err := exec.Command("go", "build", "-o", path, "github.com/cronstream/cronstream/cmd/cronstream").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build ./cmd/cronstream: %w\n%s", err, out)
		}
		return path, nil
	})
}

// natsServerBin is nats-server, built once per test process from the
// module's dependency.
func natsServerBin(b testing.TB) string {
	return buildBinary(b, "nats-server", testenv.BuildNATSServer)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// system is one deployment on this machine: a nats-server (embedded in
// this test process, or a process of its own), a private redis-server, and
// the replica processes started on them.
type system struct {
	b        testing.TB
	nats     *testenv.NATS        // the embedded server; nil when natsProc runs
	natsProc *testenv.NATSProcess // the server process; nil when embedded
	redis    *testenv.Redis
	rc       *redis.Client
	js       jetstream.JetStream
	names    events.Names
	redisPID int
	bin      string
}

// systemConfig says how a system is set up; the zero value is the
// embedded nats-server.
type systemConfig struct {
	// natsProcess runs nats-server as a process of its own, so its CPU is
	// measured apart from this process's (the harness).
	natsProcess bool
}

func newSystem(b testing.TB) *system { return newSystemWith(b, systemConfig{}) }

func newSystemWith(b testing.TB, cfg systemConfig) *system {
	b.Helper()
	s := &system{b: b, bin: cronstreamBin(b), names: events.MustNames(events.DefaultPrefix)}
	if cfg.natsProcess {
		s.natsProc = testenv.StartNATSProcess(b, natsServerBin(b))
		s.js = s.natsProc.JetStream(b)
	} else {
		s.nats = testenv.StartNATS(b)
		s.js = s.nats.JetStream(b)
	}
	s.redis = testenv.StartRedis(b, testenv.WithPrivateServer())
	s.rc = s.redis.Client(b)
	if err := events.EnsureStreams(context.Background(), s.js, events.StreamConfig{Names: s.names}); err != nil {
		b.Fatal(err)
	}
	s.redisPID = testenv.RedisPID(b, s.rc)
	return s
}

func (s *system) natsURL() string {
	if s.natsProc != nil {
		return s.natsProc.URL()
	}
	return s.nats.URL()
}

// natsPID is the nats-server process's id, 0 when it is embedded in this
// process.
func (s *system) natsPID() int {
	if s.natsProc != nil {
		return s.natsProc.PID()
	}
	return 0
}

// env is the environment of a cronstream command on this system: the
// test's own without CRONSTREAM_* variables, plus the two servers.
func (s *system) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CRONSTREAM_") {
			out = append(out, kv)
		}
	}
	return append(out, "CRONSTREAM_NATS="+s.natsURL(), "CRONSTREAM_REDIS="+s.redis.URL)
}

// command runs a cronstream command to completion and returns its run time.
func (s *system) command(args ...string) time.Duration {
	s.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env = s.env()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		s.b.Fatalf("cronstream %s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 30))
	}
	return took
}

// replicaProc is one `cronstream run` process.
type replicaProc struct {
	id      string
	http    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// startReplica starts `cronstream run` with its HTTP endpoints on a free
// loopback port; it is stopped at cleanup if the benchmark did not stop it.
func (s *system) startReplica(id string, extra ...string) *replicaProc {
	s.b.Helper()
	return s.startReplicaWith(id, replicaConfig{args: extra})
}

// replicaConfig is what a replica is started with beyond its id and
// endpoints; the zero value is a replica as startReplica starts it.
type replicaConfig struct {
	args []string // more flags of `cronstream run`
	env  []string // more environment (GOMAXPROCS=1), after the system's
	// group, when set, is the CPU group the process runs in.
	group *testenv.CPUGroup
}

func (s *system) startReplicaWith(id string, cfg replicaConfig) *replicaProc {
	s.b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	// CRONSTREAM_BENCH_LOG_DIR keeps each replica's log there, at debug.
	level, dir := "warn", os.Getenv("CRONSTREAM_BENCH_LOG_DIR")
	if dir != "" {
		level = "debug"
	} else {
		dir = s.b.TempDir()
	}
	p := &replicaProc{id: id, http: addr, logPath: filepath.Join(dir, id+".log"), done: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		s.b.Fatal(err)
	}
	args := append([]string{"run", "--replica-id", id, "--http", addr, "--log-level", level}, cfg.args...)
	p.cmd = exec.Command(s.bin, args...)
	p.cmd.Env = append(s.env(), cfg.env...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	start := p.cmd.Start
	if cfg.group != nil {
		start = func() error { return cfg.group.Start(p.cmd) }
	}
	if err := start(); err != nil {
		_ = logFile.Close()
		s.b.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	s.b.Cleanup(func() {
		p.kill()
		if s.b.Failed() {
			s.b.Logf("replica %s log tail:\n%s", p.id, p.logTail())
		}
	})
	return p
}

// kill stops the process with SIGKILL (no flush) and waits for it.
func (p *replicaProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *replicaProc) pid() int { return p.cmd.Process.Pid }

func (p *replicaProc) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), 30)
}

func (p *replicaProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM (the replica stops firing, flushes its outbox to NATS
// and exits) and waits for the exit.
func (p *replicaProc) stop(b testing.TB) {
	b.Helper()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		b.Fatalf("replica %s did not exit within 2m of SIGTERM; log:\n%s", p.id, p.logTail())
	}
}

// stopAll stops the replicas at once, so none of them picks up the others'
// entries while they go.
func stopAll(b testing.TB, ps []*replicaProc) {
	b.Helper()
	for _, p := range ps {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range ps {
		p.stop(b)
	}
}

func (p *replicaProc) get(path string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.http + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric is the sum of every series of the named metric on /metrics.
func (p *replicaProc) metric(name string) (float64, bool) {
	code, body, err := p.get("/metrics")
	if err != nil || code != http.StatusOK {
		return 0, false
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// waitLoaded waits until every replica answers /readyz and the replicas
// together schedule n entries: each schedules only the entries of the
// shards it owns, so the sum is n once every shard has its owner.
func waitLoaded(b testing.TB, ps []*replicaProc, n int, timeout time.Duration) {
	b.Helper()
	testenv.Eventually(b, timeout, func() bool {
		sum := 0
		for _, p := range ps {
			if p.exited() {
				b.Fatalf("replica %s exited: %v; log:\n%s", p.id, p.err, p.logTail())
			}
			code, _, err := p.get("/readyz")
			if err != nil || code != http.StatusOK {
				return false
			}
			v, ok := p.metric("cronstream_scheduler_entries")
			if !ok {
				return false
			}
			sum += int(v)
		}
		return sum == n
	}, "%d replica(s) ready, scheduling %d entries between them", len(ps), n)
}

// cpuUse is CPU time spent by the replicas, redis-server and this process.
type cpuUse struct{ replicas, redis, self time.Duration }

func (s *system) cpu(ps []*replicaProc) cpuUse {
	u := cpuUse{redis: testenv.ProcCPU(s.redisPID), self: testenv.SelfCPU()}
	for _, p := range ps {
		u.replicas += testenv.ProcCPU(p.pid())
	}
	return u
}

func (u cpuUse) sub(o cpuUse) cpuUse {
	return cpuUse{replicas: u.replicas - o.replicas, redis: u.redis - o.redis, self: u.self - o.self}
}

func usPer(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(n)
}

// register publishes a registered event per entry straight to the config
// stream (what `entry put` publishes, without its read of the entry first).
func (s *system) register(entries []events.Entry) {
	s.b.Helper()
	eventtest.Register(s.b, s.js, s.names, "systembench", entries, time.Minute)
}

// entries returns n entries id<prefix><i> on spec, enqueuing into "default".
func entries(prefix, spec string, n int) []events.Entry {
	out := make([]events.Entry, n)
	for i := range out {
		id := fmt.Sprintf("%s%06d", prefix, i)
		out[i] = events.Entry{ID: id, Cron: spec, Task: events.Task{Type: "bench:" + prefix, Payload: []byte(`{"id":"` + id + `"}`)}}
	}
	return out
}

// activityMsgs is the number of messages in the activity stream.
func (s *system) activityMsgs() uint64 { return testenv.StreamMsgCount(s.js, s.names.ActivityStream()) }

// recoveryEvents counts the events on the activity stream's recovery
// subjects and the messages that hold them.
func (s *system) recoveryEvents() (evs, msgs int) {
	s.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := s.js.Stream(ctx, s.names.ActivityStream())
	if err != nil {
		s.b.Fatal(err)
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.names.RecoveryFilter()}})
	if err != nil {
		s.b.Fatal(err)
	}
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			s.b.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			parts, err := events.SplitEvents(m.Data())
			if err != nil {
				s.b.Fatalf("recovery message on %s: %v", m.Subject(), err)
			}
			evs += len(parts)
		}
		msgs += got
		if got == 0 {
			return evs, msgs
		}
	}
}

// pending is the length of queue's pending list.
func (s *system) pending(queue string) int64 {
	return s.rc.LLen(context.Background(), taskstate.Keys(queue).Pending()).Val()
}

// pendingAll is the sum of the queues' pending lists: every task fired into
// them while no worker runs.
func (s *system) pendingAll(queues []string) int64 {
	ctx := context.Background()
	pipe := s.rc.Pipeline()
	cmds := make([]*redis.IntCmd, len(queues))
	for i, q := range queues {
		cmds[i] = pipe.LLen(ctx, taskstate.Keys(q).Pending())
	}
	_, _ = pipe.Exec(ctx)
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n
}

// fireObs is one fired event as read back from the activity stream, with
// its task's enqueue time.
type fireObs struct {
	entry, taskID, queue string
	scheduled            time.Time
	// enqueued is the task's pending_since (Redis time when the task was
	// written); the event's own enqueued_at is the replica's clock when it
	// prepared the fire, earlier in a burst.
	enqueued time.Time
	inStream time.Time // the activity stream's timestamp of the event
}

// fireLog is every fired event in the activity stream, and how many
// skipped events it holds.
type fireLog struct {
	fires   []fireObs
	skipped int
}

// readFires reads the whole activity stream's fire subjects.
func (s *system) readFires() fireLog {
	s.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := s.js.Stream(ctx, s.names.ActivityStream())
	if err != nil {
		s.b.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		s.b.Fatal(err)
	}
	var out fireLog
	if info.State.Msgs == 0 {
		return out
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.names.Prefix() + ".fire.>"}})
	if err != nil {
		s.b.Fatal(err)
	}
	for {
		batch, err := c.Fetch(10_000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			s.b.Fatal(err)
		}
		got, last := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				s.b.Fatal(err)
			}
			last = md.NumPending == 0
			ev, err := events.DecodeEvent(m.Data())
			if err != nil {
				s.b.Fatalf("activity message %d: %v", md.Sequence.Stream, err)
			}
			switch ev.Type {
			case events.TypeEntryFired:
				var f events.Fired
				if err := ev.DecodeData(&f); err != nil {
					s.b.Fatalf("activity message %d: %v", md.Sequence.Stream, err)
				}
				out.fires = append(out.fires, fireObs{entry: f.Entry, taskID: f.TaskID, queue: f.Queue, scheduled: f.ScheduledAt, inStream: md.Timestamp})
			case events.TypeEntrySkipped:
				out.skipped++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			s.b.Fatal(err)
		}
		if last || got == 0 {
			s.readEnqueueTimes(out.fires)
			return out
		}
	}
}

// readEnqueueTimes sets each fire's enqueued from its task's pending_since;
// a task without one fails the benchmark.
func (s *system) readEnqueueTimes(fires []fireObs) {
	s.b.Helper()
	ctx := context.Background()
	const chunk = 5000
	for start := 0; start < len(fires); start += chunk {
		part := fires[start:min(start+chunk, len(fires))]
		pipe := s.rc.Pipeline()
		cmds := make([]*redis.StringCmd, len(part))
		for i, f := range part {
			cmds[i] = pipe.HGet(ctx, taskstate.Keys(f.queue).Task(f.taskID), "pending_since")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			s.b.Fatal(err)
		}
		for i, c := range cmds {
			ns, err := strconv.ParseInt(c.Val(), 10, 64)
			if err != nil {
				s.b.Fatalf("task %s of entry %s (tick %s): no pending_since (%v)", part[i].taskID, part[i].entry, part[i].scheduled, c.Err())
			}
			part[i].enqueued = time.Unix(0, ns)
		}
	}
}

// outboxLen is the number of records in every outbox of the tenant.
func (s *system) outboxLen(ctx context.Context) int64 {
	queues, err := s.rc.SMembers(ctx, taskstate.OutboxesKey(s.names.Prefix())).Result()
	if err != nil {
		return -1
	}
	var n int64
	for _, q := range queues {
		n += s.rc.XLen(ctx, taskstate.Own(s.names.Prefix(), q).Outbox()).Val()
	}
	return n
}

type backlogSample struct {
	at     time.Time
	events int64
}

// eventBacklog is the fires in queues without an event in the activity
// stream: tasks written less the stream's messages.
func (s *system) eventBacklog(queues ...string) int64 {
	return s.pendingAll(queues) - int64(s.activityMsgs())
}

// sampleBacklog samples, every interval until the returned stop is called
// (which returns the samples), how many of the queues' fires have no event
// in the activity stream yet: tasks in their pending lists (the benchmarks
// that sample run no workers) minus the stream's messages. Counting the
// outbox's records instead would count the fires of one script call once.
func (s *system) sampleBacklog(interval time.Duration, queues ...string) (stop func() []backlogSample) {
	ctx, cancel := context.WithCancel(context.Background())
	var samples []backlogSample
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			samples = append(samples, backlogSample{at: time.Now(), events: s.eventBacklog(queues...)})
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() []backlogSample {
		cancel()
		<-done
		return samples
	}
}

// backlogTrend is the largest sample and the least-squares slope (events
// per second) over the second half of the samples.
func backlogTrend(samples []backlogSample) (largest int64, slope float64) {
	for _, x := range samples {
		largest = max(largest, x.events)
	}
	return largest, backlogSlope(samples[len(samples)/2:])
}

// backlogSlope is the least-squares slope of the samples (events per
// second); 0 for fewer than two.
func backlogSlope(samples []backlogSample) (slope float64) {
	if len(samples) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for _, x := range samples {
		t := x.at.Sub(samples[0].at).Seconds()
		y := float64(x.events)
		sx, sy, sxx, sxy = sx+t, sy+y, sxx+t*t, sxy+t*y
	}
	n := float64(len(samples))
	if d := n*sxx - sx*sx; d != 0 {
		slope = (n*sxy - sx*sy) / d
	}
	return slope
}

// slowlog records every Redis call that takes slowCallMin or more of
// server time, from start until the returned stop, which restores the
// server's settings and returns the longest call. It does not record every
// call: Redis logs the commands a script runs as well as the script, and
// with every call logged (about a dozen per recovered task) the logging
// itself, done inside the script, lengthened the calls it measured.
func slowlog(b testing.TB, rc *redis.Client) (stop func() slowCall) {
	b.Helper()
	ctx := context.Background()
	prev, err := rc.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		b.Fatal(err)
	}
	for k, v := range map[string]string{"slowlog-log-slower-than": strconv.FormatInt(slowCallMin.Microseconds(), 10), "slowlog-max-len": strconv.Itoa(slowlogKeep)} {
		if err := rc.ConfigSet(ctx, k, v).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := rc.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		b.Fatal(err)
	}
	return func() slowCall {
		// Stop recording first, so reading the log does not add to it.
		if err := rc.ConfigSet(ctx, "slowlog-log-slower-than", prev["slowlog-log-slower-than"]).Err(); err != nil {
			b.Fatal(err)
		}
		// The reply is long: a client of its own with a long read timeout.
		opts := *rc.Options()
		opts.ReadTimeout = 5 * time.Minute
		reader := redis.NewClient(&opts)
		defer reader.Close()
		logs, err := reader.SlowLogGet(ctx, -1).Result()
		if err != nil {
			b.Fatal(err)
		}
		var longest slowCall
		over := 0
		for _, l := range logs {
			if l.Duration > callBudget {
				over++
			}
			if l.Duration > longest.took {
				// The command and its first arguments (for a script, the
				// first key) say which call it was.
				var args []string
				for _, a := range l.Args[:min(len(l.Args), 4)] {
					args = append(args, strconv.Quote(a[:min(len(a), 64)]))
				}
				longest = slowCall{took: l.Duration, command: strings.Join(args, " ")}
			}
		}
		longest.calls, longest.over, longest.full = len(logs), over, len(logs) >= slowlogKeep
		if err := reader.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
			b.Fatal(err)
		}
		if err := rc.ConfigSet(ctx, "slowlog-max-len", prev["slowlog-max-len"]).Err(); err != nil {
			b.Fatal(err)
		}
		return longest
	}
}

const (
	// slowCallMin is the shortest call SLOWLOG records: a tenth of the
	// 10 ms a call may take.
	slowCallMin = time.Millisecond
	// slowlogKeep is how many such calls it keeps.
	slowlogKeep = 250_000
)

// slowCall is the longest Redis call SLOWLOG saw, out of calls of
// slowCallMin or more.
type slowCall struct {
	took    time.Duration
	command string
	calls   int
	over    int  // calls over callBudget
	full    bool // the log filled up: the earliest calls are not in it
}

// callBudget is the longest a Redis call should take (issue goals).
const callBudget = 10 * time.Millisecond

func (c slowCall) String() string {
	if c.calls == 0 {
		return fmt.Sprintf("none of %s or more", slowCallMin)
	}
	s := fmt.Sprintf("%s (%s) of %d calls of %s or more, %d over %s", c.took, c.command, c.calls, slowCallMin, c.over, callBudget)
	if c.full {
		s += " (SLOWLOG full: the earliest calls were dropped)"
	}
	return s
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[int(float64(len(d)-1)*p)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// waitUntil sleeps until t: the benchmarks wait for wall-clock instants
// (tick boundaries), not for conditions.
func waitUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// nextSecond returns the next whole second plus off (off < 1 s): a window
// edge between two seconds' bursts of fires, so a window holds whole
// seconds of work.
func nextSecond(off time.Duration) time.Time {
	return time.Now().Truncate(time.Second).Add(time.Second + off)
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// commandTime is one Redis command's share of server time over a window.
type commandTime struct {
	name  string
	calls int64
	usec  int64
}

// resetCommandStats starts a window of Redis's per-command counters.
func resetCommandStats(b testing.TB, rc *redis.Client) {
	b.Helper()
	if err := rc.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// commandStats returns the commands Redis ran since resetCommandStats, the
// most server time first. Commands a script runs count under their own
// names as well as in the script's time.
func commandStats(b testing.TB, rc *redis.Client) []commandTime {
	b.Helper()
	var out []commandTime
	for name, c := range testenv.RedisCommandStats(b, rc) {
		out = append(out, commandTime{name: name, calls: c.Calls, usec: c.Usec})
	}
	slices.SortFunc(out, func(a, b commandTime) int { return cmp.Compare(b.usec, a.usec) })
	return out
}

// commandsPer formats the first few commands as server µs per unit of
// work (a fire, a recovered task).
func commandsPer(cs []commandTime, units int, top int) string {
	var parts []string
	for _, c := range cs[:min(len(cs), top)] {
		parts = append(parts, fmt.Sprintf("%s %.1f µs (%.2f calls)", c.name, float64(c.usec)/float64(max(units, 1)), float64(c.calls)/float64(max(units, 1))))
	}
	return strings.Join(parts, ", ")
}

// serverRequests is what the servers have answered so far: Redis's calls
// per command (INFO commandstats; a script is one call of EVALSHA, and
// the commands it runs are counted under their own names) and the
// account's JetStream API calls (fetches, infos, consumer changes; a
// publish is not one). The harness's own reads are among them, a few a
// second.
func (s *system) serverRequests() (redisCalls map[string]int64, jsAPI uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	redisCalls = map[string]int64{}
	info, _ := s.rc.Info(ctx, "commandstats").Result()
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_<name>:calls=N,usec=...
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		if n, err := strconv.ParseInt(calls, 10, 64); err == nil {
			redisCalls[name] = n
		}
	}
	if ai, err := s.js.AccountInfo(ctx); err == nil {
		jsAPI = ai.API.Total
	}
	return redisCalls, jsAPI
}
