package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
)

// band is a time range whose ticks may be missed: an outage (no replica up,
// or Redis down) widened by a tolerance.
type band struct {
	from, to time.Time
	why      string
}

func inBands(t time.Time, bands []band) bool {
	for _, b := range bands {
		if !t.Before(b.from) && !t.After(b.to) {
			return true
		}
	}
	return false
}

// heldTask is a task a worker had started and not finished when it was
// killed with SIGKILL.
type heldTask struct {
	id       string
	queue    string
	retried  int
	worker   string
	killedAt time.Time
}

// flush is one Redis data loss: when writes stopped (lost), when the empty
// server answered again (back), and the outbox records Redis held when
// writes stopped (decoded), which are the only events that can have been
// lost with it.
type flush struct {
	lost, back time.Time
	outbox     []activity
}

// checkInput is everything the final check compares.
type checkInput struct {
	entries    []string
	entryQueue map[string]string
	// end is the last tick every entry must have (inclusive).
	end   time.Time
	bands []band
	snap  redisSnapshot
	acts  []activity
	execs []execution
	held  []heldTask
	// unsynced are tasks a worker finished but asynq could not mark done
	// (Redis was down); asynq v0.26's syncer retries that with a context
	// already cancelled, so they stay active until their lease expires and
	// a recoverer retries them.
	unsynced map[string]bool
	// flushes are the Redis data losses, in order.
	flushes []flush
}

// report is the outcome of the final check. Fields are counts; examples
// keeps a few instances of each problem for the failure message.
type report struct {
	entries, neverFired                       int
	ticksExpected, ticksInBands               int
	tasks, tasksInRange                       int
	dupTwoQueues, dupTwoStates                int
	dupFiredEvents, dupFiredTicks             int
	firedEvents, lostEvents, phantomEvents    int
	mismatchedEvents                          int
	missedOutside, missedInBands              int
	missedInBandsSkipped, unaccounted         int
	skipEvents, skippedTicks, skippedAndFired int
	doubleSkipped                             int
	executions, distinctExecuted              int
	executedNotInRedis, reexecSameAttempt     int
	held, recoveredOurs, recoveredAsynq       int
	notRecovered, doubleRecoveries            int
	recoveryEvents, otherRecoveries           int
	otherUnsynced, heldUnknown                int
	firedBy                                   map[string]int
	early                                     int
	// pausedSkipEvents counts the skipped events with reason paused (ticks
	// due before the final pause that no replica had fired), counted in
	// skipEvents too.
	pausedSkipEvents int

	// Across Redis data losses (see doc.go).
	flushes                            int
	firedFlushed, executedFlushed      int
	heldFlushed                        int
	lostFired, lostSkipped             int
	lostSkippedTicks, lostRecoveries   int
	ticksLostWithRedis                 int
	dupAfterLoss, dupLostRecordRefired int

	examples map[string][]string
}

func (r *report) example(kind, format string, args ...any) {
	if r.examples == nil {
		r.examples = map[string][]string{}
	}
	if len(r.examples[kind]) < 5 {
		r.examples[kind] = append(r.examples[kind], fmt.Sprintf(format, args...))
	}
}

// duplicates is every way a tick was enqueued or announced more than once.
func (r *report) duplicates() int {
	return r.dupTwoQueues + r.dupTwoStates + r.dupFiredEvents + r.dupFiredTicks + r.skippedAndFired + r.doubleSkipped + r.reexecSameAttempt + r.doubleRecoveries +
		r.dupAfterLoss + r.dupLostRecordRefired
}

// lostWithRedis is every record the Redis data losses took before the
// relay published it: allowed, and reported on its own.
func (r *report) lostWithRedis() int {
	return r.lostFired + r.lostSkipped + r.lostRecoveries
}

// lost is every piece of history or work that went missing.
func (r *report) lost() int {
	return r.lostEvents + r.phantomEvents + r.mismatchedEvents + r.executedNotInRedis + r.notRecovered + r.unaccounted
}

type tickKey struct {
	entry string
	tick  int64
}

// parseTaskID splits "<prefix>:<entry>:<RFC3339 tick>".
func parseTaskID(id string) (tickKey, bool) {
	rest, ok := strings.CutPrefix(id, prefix+":")
	if !ok {
		return tickKey{}, false
	}
	entry, ts, ok := strings.Cut(rest, ":")
	if !ok {
		return tickKey{}, false
	}
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return tickKey{}, false
	}
	return tickKey{entry, t.Unix()}, true
}

// earlyTolerance is how far before its tick a fired event may have been
// stored: the replicas and NATS share this host's clock, so anything beyond
// rounding is a fire ahead of its tick (a replica trusting a clock that is
// off).
const earlyTolerance = time.Second

// check compares Redis, the activity stream and the workers' logs.
func check(ctx context.Context, rdb *redis.Client, in checkInput) report {
	var r report
	r.entries = len(in.entries)
	r.firedBy = map[string]int{}
	r.flushes = len(in.flushes)

	// Every task created before a data loss is gone with it, so what Redis
	// holds now was created after the last one came back: lastBack.
	var lastBack time.Time
	for _, f := range in.flushes {
		if f.back.After(lastBack) {
			lastBack = f.back
		}
	}

	// Tasks in Redis: where each id is.
	tasks := map[tickKey]string{} // → task id
	taskQueue := map[string]string{}
	ids := map[string]bool{}
	for id := range in.snap.places {
		ids[id] = true
	}
	for id := range in.snap.hashes {
		ids[id] = true
	}
	for id := range ids {
		k, ok := parseTaskID(id)
		if !ok {
			continue
		}
		queues := map[string]bool{}
		for _, q := range in.snap.hashes[id] {
			queues[q] = true
		}
		for _, p := range in.snap.places[id] {
			queues[p.queue] = true
		}
		if len(queues) > 1 {
			r.dupTwoQueues++
			r.example("same task id in two queues", "%s in %v", id, keys(queues))
		}
		if n := len(in.snap.places[id]); n > 1 {
			r.dupTwoStates++
			r.example("task id in two states", "%s in %v", id, in.snap.places[id])
		}
		tasks[k] = id
		for q := range queues {
			taskQueue[id] = q
		}
	}
	r.tasks = len(tasks)

	// Records Redis held when it lost its data and the relay never
	// published: lost with Redis. Their ticks had been handled (the record
	// is written in the script that enqueues or skips), so they count as
	// neither missed nor unaccounted; a tick of a lost fired record that
	// has a task now was fired a second time.
	published := map[string]activity{} // first event with each id
	for _, a := range in.acts {
		if _, ok := published[a.msgID]; !ok {
			published[a.msgID] = a
		}
	}
	inLostOutbox := map[string]bool{}
	lostFired := map[tickKey]bool{}
	lostSkipped := map[tickKey]bool{}
	for i, f := range in.flushes {
		for _, a := range f.outbox {
			inLostOutbox[a.msgID] = true
			p, ok := published[a.msgID]
			if ok && (a.fired == nil || p.fired != nil && sameFire(*p.fired, *a.fired)) {
				continue // the relay had it in flight: it reached the stream
			}
			switch {
			case a.fired != nil:
				r.lostFired++
				k := tickKey{a.fired.Entry, a.fired.ScheduledAt.Unix()}
				lostFired[k] = true
				_, task := tasks[k]
				if task || ok {
					// A fired event ids its tick, so a second fire of
					// it publishes under the lost record's id, with
					// another enqueue time.
					r.dupLostRecordRefired++
					r.example("tick of a record lost with Redis fired again", "%s (loss %d; a task now: %v, an event of another fire: %v)", a.msgID, i+1, task, ok)
				}
			case a.skipped != nil:
				r.lostSkipped++
				until := a.skipped.ScheduledAt
				if a.skipped.Until != nil {
					until = *a.skipped.Until
				}
				for t := a.skipped.ScheduledAt.Unix(); t <= until.Unix(); t++ {
					lostSkipped[tickKey{a.skipped.Entry, t}] = true
					r.lostSkippedTicks++
				}
			case a.recovered != nil:
				r.lostRecoveries++
			}
		}
	}
	r.ticksLostWithRedis = len(lostFired)

	// Fired and skipped events.
	firedIDs := map[string]int{}
	fired := map[tickKey]int{}
	skipped := map[tickKey]int{}
	recoveries := map[string]int{} // task id + attempt → events
	for _, a := range in.acts {
		switch {
		case a.fired != nil:
			r.firedEvents++
			firedIDs[a.msgID]++
			if firedIDs[a.msgID] > 1 {
				r.dupFiredEvents++
				r.example("fired event twice", "%s (seq %d)", a.msgID, a.seq)
				continue
			}
			f := a.fired
			r.firedBy[f.Replica]++
			k := tickKey{f.Entry, f.ScheduledAt.Unix()}
			fired[k]++
			if fired[k] > 1 {
				r.dupFiredTicks++
				r.example("tick fired twice", "%s %s (event %s)", f.Entry, f.ScheduledAt.Format(time.RFC3339), a.msgID)
			}
			if a.stored.Before(f.ScheduledAt.Add(-earlyTolerance)) {
				r.early++
				r.example("fired before its tick", "%s stored %s by replica %s", a.msgID, a.stored.UTC().Format(time.RFC3339Nano), f.Replica)
			}
			id, ok := tasks[k]
			switch {
			case !ok && (a.stored.Before(lastBack) || inLostOutbox[a.msgID]):
				// Published before Redis came back empty, or from a
				// record it held when it lost its data: the task was
				// created before the loss and went with it.
				r.firedFlushed++
			case !ok:
				r.phantomEvents++
				r.example("fired event without task", "%s task %s", a.msgID, f.TaskID)
			case id != f.TaskID || taskQueue[id] != f.Queue:
				r.mismatchedEvents++
				r.example("fired event disagrees with task", "%s says %s in %s, Redis has %s in %s", a.msgID, f.TaskID, f.Queue, id, taskQueue[id])
			case a.stored.Before(lastBack):
				// The task was created after the last loss, the event
				// reached the stream before Redis came back: the tick
				// fired again after the data loss (its second event was
				// dropped as a duplicate by the stream).
				r.dupAfterLoss++
				r.example("tick fired again after Redis lost its data", "%s (event stored %s)", a.msgID, a.stored.UTC().Format(time.RFC3339Nano))
			}
		case a.skipped != nil:
			s := a.skipped
			switch s.Reason {
			case events.SkipMissed:
			case events.SkipPaused:
				r.pausedSkipEvents++
			default:
				continue
			}
			r.skipEvents++
			until := s.ScheduledAt
			if s.Until != nil {
				until = *s.Until
			}
			for t := s.ScheduledAt.Unix(); t <= until.Unix(); t++ {
				k := tickKey{s.Entry, t}
				skipped[k]++
				r.skippedTicks++
				if skipped[k] == 2 {
					r.doubleSkipped++
					r.example("tick skipped twice", "%s %s", s.Entry, time.Unix(t, 0).UTC().Format(time.RFC3339))
				}
			}
		case a.recovered != nil:
			r.recoveryEvents++
			key := fmt.Sprintf("%s#%d", a.recovered.TaskID, a.attempt)
			recoveries[key]++
			if recoveries[key] == 2 {
				r.doubleRecoveries++
				r.example("task recovered twice", "%s attempt %d (event %s)", a.recovered.TaskID, a.attempt, a.msgID)
			}
		}
	}
	// A skipped tick must have neither a task nor a fired event (a task
	// gone with a data loss still has its event), nor a fired record lost
	// with Redis.
	for k, n := range skipped {
		_, task := tasks[k]
		if task || fired[k] > 0 || lostFired[k] {
			r.skippedAndFired++
			r.example("tick both skipped and enqueued", "%s %s (skipped %d times)", k.entry, time.Unix(k.tick, 0).UTC().Format(time.RFC3339), n)
		}
	}
	for k, id := range tasks {
		if fired[k] == 0 {
			r.lostEvents++
			r.example("task without fired event", "%s", id)
		}
	}

	// A tick was handled when it has a task, a fired event (its task may
	// have gone with a data loss; one without any reason is counted as
	// lost above) or a fired record lost with Redis.
	handled := func(k tickKey) bool {
		_, task := tasks[k]
		return task || fired[k] > 0 || lostFired[k]
	}
	// Expected ticks per entry, from its first handled tick to the end.
	first := map[string]int64{}
	note := func(k tickKey) {
		if f, ok := first[k.entry]; !ok || k.tick < f {
			first[k.entry] = k.tick
		}
	}
	for k := range tasks {
		note(k)
	}
	for k := range fired {
		note(k)
	}
	for k := range lostFired {
		note(k)
	}
	end := in.end.Unix()
	for _, e := range in.entries {
		f, ok := first[e]
		if !ok {
			r.neverFired++
			r.example("entry never fired", "%s", e)
			continue
		}
		for t := f; t <= end; t++ {
			k := tickKey{e, t}
			at := time.Unix(t, 0)
			outage := inBands(at, in.bands)
			if outage {
				r.ticksInBands++
			} else {
				r.ticksExpected++
			}
			if handled(k) {
				r.tasksInRange++
				continue
			}
			if skipped[k] == 0 && !lostSkipped[k] {
				r.unaccounted++
				r.example("tick neither enqueued nor skipped", "%s %s", e, at.UTC().Format(time.RFC3339))
			}
			if outage {
				r.missedInBands++
				if skipped[k] > 0 || lostSkipped[k] {
					r.missedInBandsSkipped++
				}
				continue
			}
			r.missedOutside++
			r.example("tick missed outside outages", "%s %s (skip events covering it: %d, skip record lost with Redis: %v)", e, at.UTC().Format(time.RFC3339), skipped[k], lostSkipped[k])
		}
	}

	// Executions the workers logged.
	attempts := map[string]int{}
	distinct := map[string]bool{}
	for _, x := range in.execs {
		k, ok := parseTaskID(x.id)
		if !ok {
			continue
		}
		r.executions++
		distinct[x.id] = true
		key := fmt.Sprintf("%s#%d", x.id, x.retried)
		attempts[key]++
		if attempts[key] == 2 {
			r.reexecSameAttempt++
			r.example("task started twice in one attempt", "%s attempt %d", x.id, x.retried)
		}
		if !ids[x.id] {
			if len(in.flushes) > 0 && (fired[k] > 0 || lostFired[k]) {
				r.executedFlushed++ // a task of before a data loss
				continue
			}
			r.executedNotInRedis++
			r.example("executed task not in Redis", "%s", x.id)
		}
	}
	r.distinctExecuted = len(distinct)

	// Tasks the killed workers held: each recovered once, by us or asynq,
	// or gone with a data loss while they were held (lostWhileHeld).
	heldKeys := map[string]bool{}
	for _, h := range in.held {
		r.held++
		key := fmt.Sprintf("%s#%d", h.id, h.retried)
		heldKeys[key] = true
		if recoveries[key] > 0 {
			r.recoveredOurs++
			continue
		}
		retried, state, err := taskRetried(ctx, rdb, h.queue, h.id)
		switch {
		case errors.Is(err, errNoTaskHash) && lostWhileHeld(in.flushes, h.killedAt):
			r.heldFlushed++
		case err != nil:
			r.heldUnknown++
			r.example("held task unreadable", "%s: %v", h.id, err)
		case retried > h.retried:
			r.recoveredAsynq++
		case state == "active":
			r.notRecovered++
			r.example("held task not recovered", "%s attempt %d still active (worker %s)", h.id, h.retried, h.worker)
		default:
			r.heldUnknown++
			r.example("held task in an unexpected state", "%s attempt %d: state %s retried %d", h.id, h.retried, state, retried)
		}
	}
	for key := range recoveries {
		if heldKeys[key] {
			continue
		}
		r.otherRecoveries++
		if id, _, _ := strings.Cut(key, "#"); in.unsynced[id] {
			r.otherUnsynced++
			continue
		}
		r.example("recovered attempt not in the held list", "%s", key)
	}
	return r
}

// sameFire reports whether two fired events describe the same fire (the
// enqueue instant is the replica's clock at the fire, in nanoseconds).
func sameFire(a, b events.Fired) bool {
	return a.EnqueuedAt.Equal(b.EnqueuedAt) && a.Replica == b.Replica && a.TaskID == b.TaskID && a.Queue == b.Queue
}

// workerMaxWork is the longest a chaos worker's handler runs (its
// --max-work default): a task a worker held when killed started at most
// this long before.
const workerMaxWork = 2 * time.Second

// lostWhileHeld reports whether a task a worker held when it was killed at
// killedAt can have gone with a Redis data loss: one after the kill, one
// under way at the kill (the worker kept running handlers while Redis was
// down), or one that ended so shortly before the kill that the task may
// have started before it.
func lostWhileHeld(flushes []flush, killedAt time.Time) bool {
	for _, f := range flushes {
		if f.lost.After(killedAt) || f.back.After(killedAt.Add(-workerMaxWork)) {
			return true
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// String is the summary the tests print.
func (r *report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  entries: %d (never fired: %d)\n", r.entries, r.neverFired)
	fmt.Fprintf(&b, "  ticks expected (outside outage bands): %d; ticks inside outage bands: %d\n", r.ticksExpected, r.ticksInBands)
	fmt.Fprintf(&b, "  tasks in Redis: %d; ticks handled in the checked range: %d\n", r.tasks, r.tasksInRange)
	fmt.Fprintf(&b, "  duplicates: %d (task id in two queues %d, in two states %d, fired event twice %d, tick fired twice %d, skipped and enqueued %d, skipped twice %d, started twice in one attempt %d, recovered twice %d, fired again after its event reached the stream before a Redis data loss %d, fired again after its record was lost with Redis %d)\n",
		r.duplicates(), r.dupTwoQueues, r.dupTwoStates, r.dupFiredEvents, r.dupFiredTicks, r.skippedAndFired, r.doubleSkipped, r.reexecSameAttempt, r.doubleRecoveries, r.dupAfterLoss, r.dupLostRecordRefired)
	fmt.Fprintf(&b, "  fired before their tick: %d\n", r.early)
	if r.flushes > 0 {
		fmt.Fprintf(&b, "  Redis data losses: %d; lost with Redis (records not yet relayed): %d (fired %d = %d ticks, skipped %d covering %d ticks, recoveries %d)\n",
			r.flushes, r.lostWithRedis(), r.lostFired, r.ticksLostWithRedis, r.lostSkipped, r.lostSkippedTicks, r.lostRecoveries)
		fmt.Fprintf(&b, "  gone with the data (expected): fired events whose task was flushed %d, executions of flushed tasks %d, held tasks flushed before recovery %d\n",
			r.firedFlushed, r.executedFlushed, r.heldFlushed)
	}
	fmt.Fprintf(&b, "  missed: %d outside outages; %d inside outage bands (%d covered by skipped events); unaccounted (no task, no skipped event): %d\n",
		r.missedOutside, r.missedInBands, r.missedInBandsSkipped, r.unaccounted)
	fmt.Fprintf(&b, "  fired events: %d, skipped(missed or paused) events: %d (%d paused) covering %d ticks; fired by replica: %v\n", r.firedEvents, r.skipEvents, r.pausedSkipEvents, r.skippedTicks, sortedCounts(r.firedBy))
	fmt.Fprintf(&b, "  lost events: %d (task without fired event %d, fired event without task %d, event disagreeing with task %d)\n",
		r.lostEvents+r.phantomEvents+r.mismatchedEvents, r.lostEvents, r.phantomEvents, r.mismatchedEvents)
	fmt.Fprintf(&b, "  executions: %d starts of %d distinct tasks; executed but not in Redis: %d\n", r.executions, r.distinctExecuted, r.executedNotInRedis)
	fmt.Fprintf(&b, "  tasks held by killed workers: %d; recovered by cronstream with one event: %d, by asynq's own recoverer first: %d, not recovered: %d, unclear: %d\n",
		r.held, r.recoveredOurs, r.recoveredAsynq, r.notRecovered, r.heldUnknown)
	fmt.Fprintf(&b, "  recovery events: %d (recovered twice: %d); %d for attempts not in the held list: %d finished while Redis was down and never marked done by asynq, %d dequeued or finished by a killed worker outside its logged start..end\n",
		r.recoveryEvents, r.doubleRecoveries, r.otherRecoveries, r.otherUnsynced, r.otherRecoveries-r.otherUnsynced)
	if len(r.examples) > 0 {
		kinds := make([]string, 0, len(r.examples))
		for k := range r.examples {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		b.WriteString("  examples:\n")
		for _, k := range kinds {
			fmt.Fprintf(&b, "    %s: %s\n", k, strings.Join(r.examples[k], "; "))
		}
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
