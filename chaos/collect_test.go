package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// activity is one message of the activity stream, decoded.
type activity struct {
	seq       uint64
	stored    time.Time // when the stream stored it
	msgID     string
	typ       string
	fired     *events.Fired
	skipped   *events.Skipped
	recovered *events.TaskRecovered
	// attempt is the retry count of the lost attempt a recovery event
	// names (from its id); -1 when the id cannot be read.
	attempt int
}

// readActivity reads the whole activity stream with an ordered consumer.
func readActivity(ctx context.Context, js jetstream.JetStream, names events.Names) ([]activity, error) {
	st, err := js.Stream(ctx, names.ActivityStream())
	if err != nil {
		return nil, fmt.Errorf("activity stream: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("activity stream info: %w", err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("ordered consumer: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("consume activity: %w", err)
	}
	defer it.Stop()
	// Next has no context: stop the iterator when ctx ends.
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	out := make([]activity, 0, info.State.Msgs)
	for {
		m, err := it.Next()
		if err != nil {
			return out, fmt.Errorf("read activity after seq %d of %d: %w", len(out), last, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return out, fmt.Errorf("activity metadata: %w", err)
		}
		as, err := decodeActivities(m.Data())
		if err != nil {
			return out, fmt.Errorf("activity seq %d: %w", meta.Sequence.Stream, err)
		}
		for _, a := range as {
			a.seq, a.stored = meta.Sequence.Stream, meta.Timestamp
			if len(as) == 1 {
				a.msgID = m.Headers().Get(jetstream.MsgIDHeader)
			}
			out = append(out, a)
		}
		if meta.Sequence.Stream >= last {
			return out, nil
		}
	}
}

// decodeActivities decodes the events of an activity message (several for
// a batch); each activity's msgID is its event's id.
func decodeActivities(msg []byte) ([]activity, error) {
	parts, err := events.SplitEvents(msg)
	if err != nil {
		return nil, err
	}
	out := make([]activity, 0, len(parts))
	for _, p := range parts {
		a, err := decodeActivity(p)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func decodeActivity(b []byte) (activity, error) {
	var ev events.Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return activity{}, err
	}
	a := activity{typ: ev.Type, attempt: -1, msgID: ev.ID}
	var err error
	switch ev.Type {
	case events.TypeEntryFired:
		a.fired = &events.Fired{}
		err = json.Unmarshal(ev.Data, a.fired)
	case events.TypeEntrySkipped:
		a.skipped = &events.Skipped{}
		err = json.Unmarshal(ev.Data, a.skipped)
	case events.TypeTaskRetried, events.TypeTaskArchived:
		a.recovered = &events.TaskRecovered{}
		err = json.Unmarshal(ev.Data, a.recovered)
		if err == nil {
			a.attempt = recoveryAttempt(ev.ID, a.recovered)
		}
	}
	if err != nil {
		return activity{}, fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err)
	}
	return a, nil
}

// recoveryAttempt reads the lost attempt's retry count from a recovery
// event id, "recover:<queue token>:<task id>:<retried>:<lease expiry>".
func recoveryAttempt(id string, r *events.TaskRecovered) int {
	rest, ok := strings.CutPrefix(id, "recover:"+events.EncodeQueueToken(r.Queue)+":"+r.TaskID+":")
	if !ok {
		return -1
	}
	n, _, _ := strings.Cut(rest, ":")
	v, err := strconv.Atoi(n)
	if err != nil {
		return -1
	}
	return v
}

// taskPlace is one place a task id was found in Redis.
type taskPlace struct {
	queue, state string
}

// redisSnapshot is every asynq task id in the queues, with where it is.
type redisSnapshot struct {
	// places lists, per task id, every state collection holding it (one
	// entry per occurrence, so a list holding it twice shows twice).
	places map[string][]taskPlace
	// hashes lists, per task id, the queues with its task hash.
	hashes map[string][]string
	// active counts task ids in active lists (workers hold them).
	active int
	// leased lists, per task id, the lease expiry of active tasks.
	leased map[string]time.Time
}

// snapshotRedis reads every queue's state collections in one MULTI per
// queue (an atomic view of each queue) and then scans the task hashes.
func snapshotRedis(ctx context.Context, rdb *redis.Client, queues []string) (redisSnapshot, error) {
	snap := redisSnapshot{places: map[string][]taskPlace{}, hashes: map[string][]string{}, leased: map[string]time.Time{}}
	for _, q := range queues {
		k := taskstate.Keys(q)
		var lists [6]*redis.StringSliceCmd
		var lease *redis.ZSliceCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			lists[0] = p.LRange(ctx, k.Pending(), 0, -1)
			lists[1] = p.LRange(ctx, k.Active(), 0, -1)
			lists[2] = p.ZRange(ctx, k.Scheduled(), 0, -1)
			lists[3] = p.ZRange(ctx, k.Retry(), 0, -1)
			lists[4] = p.ZRange(ctx, k.Archived(), 0, -1)
			lists[5] = p.ZRange(ctx, k.Completed(), 0, -1)
			lease = p.ZRangeWithScores(ctx, k.Lease(), 0, -1)
			return nil
		})
		if err != nil {
			return snap, fmt.Errorf("snapshot queue %s: %w", q, err)
		}
		for i, state := range []string{"pending", "active", "scheduled", "retry", "archived", "completed"} {
			for _, id := range lists[i].Val() {
				snap.places[id] = append(snap.places[id], taskPlace{q, state})
				if state == "active" {
					snap.active++
				}
			}
		}
		for _, z := range lease.Val() {
			if id, ok := z.Member.(string); ok {
				snap.leased[id] = time.Unix(int64(z.Score), 0)
			}
		}
		var cursor uint64
		for {
			keys, next, err := rdb.Scan(ctx, cursor, k.TaskPrefix()+"*", 2000).Result()
			if err != nil {
				return snap, fmt.Errorf("scan tasks of %s: %w", q, err)
			}
			for _, key := range keys {
				id := strings.TrimPrefix(key, k.TaskPrefix())
				snap.hashes[id] = append(snap.hashes[id], q)
			}
			if next == 0 {
				break
			}
			cursor = next
		}
	}
	return snap, nil
}

// errNoTaskHash: the task's hash is not in Redis.
var errNoTaskHash = errors.New("no task hash")

// taskRetried reads a task's retry count from its hash in queue.
func taskRetried(ctx context.Context, rdb *redis.Client, queue, id string) (int, string, error) {
	vals, err := rdb.HMGet(ctx, taskstate.Keys(queue).Task(id), "msg", "state").Result()
	if err != nil {
		return 0, "", err
	}
	raw, ok := vals[0].(string)
	if !ok {
		return 0, "", errNoTaskHash
	}
	msg, err := taskstate.DecodeTaskMessage([]byte(raw))
	if err != nil {
		return 0, "", err
	}
	state, _ := vals[1].(string)
	return int(msg.Retried), state, nil
}

// outboxBacklog is the number of outbox records not yet published.
func outboxBacklog(ctx context.Context, rdb *redis.Client) (int64, error) {
	store := taskstate.New(rdb)
	qs, err := store.OutboxQueues(ctx, prefix)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, q := range qs {
		l, err := store.OutboxLen(ctx, prefix, q)
		if err != nil {
			return 0, err
		}
		n += l
	}
	return n, nil
}

// lossMarker is a key the data-loss fault writes before the loss and finds
// gone after the restart: proof the server came back empty (the replicas
// write again at once, so counting keys would prove nothing).
const lossMarker = "chaos:before-loss"

// freezeRedis prepares the data-loss fault: it turns AOF off (the server is
// now one without persistence), pauses every write and script, and reads
// every outbox, which then holds exactly the records not relayed yet: all
// that can be lost with the data besides the tasks and watermarks. It
// returns when writes stopped, the decoded records, and the files that
// still hold the data from before AOF was turned off, which the caller
// removes once the server is stopped. The pause ends with the server.
func freezeRedis(ctx context.Context, rdb *redis.Client) (time.Time, []activity, []string, error) {
	if err := rdb.Set(ctx, lossMarker, "1", 0).Err(); err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("write marker: %w", err)
	}
	cfg, err := rdb.ConfigGet(ctx, "*").Result()
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("config get: %w", err)
	}
	dir := cfg["dir"]
	if dir == "" || cfg["appenddirname"] == "" {
		return time.Time{}, nil, nil, fmt.Errorf("config get: no dir or appenddirname in %d settings", len(cfg))
	}
	files := []string{filepath.Join(dir, cfg["appenddirname"]), filepath.Join(dir, cfg["dbfilename"])}
	if err := rdb.ConfigSet(ctx, "appendonly", "no").Err(); err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("turn AOF off: %w", err)
	}
	at := time.Now()
	if err := rdb.Do(ctx, "client", "pause", 60000, "write").Err(); err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("client pause: %w", err)
	}
	store := taskstate.New(rdb)
	qs, err := store.OutboxQueues(ctx, prefix)
	if err != nil {
		return at, nil, nil, err
	}
	var out []activity
	for _, q := range qs {
		after := ""
		for {
			recs, err := store.ReadOutbox(ctx, prefix, q, after, 1000)
			if err != nil {
				return at, nil, nil, err
			}
			for _, rec := range recs {
				frames := []outbox.Frame{{ID: rec.EventID, Data: rec.Data}}
				if outbox.FormOf(rec.Data) == outbox.RecordMulti {
					if frames, err = outbox.SplitMulti(rec.Data); err != nil {
						return at, nil, nil, fmt.Errorf("outbox record %s: %w", rec.EventID, err)
					}
				}
				for _, f := range frames {
					data := f.Data
					switch outbox.FormOf(data) {
					case outbox.RecordFired:
						if data, _, err = outbox.ExpandFiredRecord(nil, f.ID, f.Data, q); err != nil {
							return at, nil, nil, fmt.Errorf("outbox record %s: %w", f.ID, err)
						}
					case outbox.RecordBatch:
						data, _ = outbox.BatchEvents(data)
					}
					as, err := decodeActivities(data)
					if err != nil {
						return at, nil, nil, fmt.Errorf("outbox record %s: %w", f.ID, err)
					}
					if len(as) == 1 {
						as[0].msgID = f.ID
					}
					out = append(out, as...)
				}
			}
			if len(recs) < 1000 {
				break
			}
			after = recs[len(recs)-1].StreamID
		}
	}
	return at, out, files, nil
}

// unsyncedRe matches asynq's warning for a finished task it could not mark
// done or completed in Redis.
var unsyncedRe = regexp.MustCompile(`Could not (?:move|remove) task id=(\S+) `)

// readUnsynced returns the task ids a worker's asynq log says it could
// not mark done.
func readUnsynced(path string, into map[string]bool) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, m := range unsyncedRe.FindAllSubmatch(b, -1) {
		into[string(m[1])] = true
	}
	return nil
}

// execution is one task start a worker logged.
type execution struct {
	id      string
	retried int
	pid     int
	ended   bool
}

// readWorkerLog reads a worker's start/end log: every start, in order,
// marked ended when the same process logged the handler's return.
func readWorkerLog(path string) ([]execution, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type key struct {
		id      string
		retried int
		pid     int
	}
	var out []execution
	open := map[key]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 4 {
			continue // a torn last line of a killed worker cannot happen, but be lenient
		}
		retried, err1 := strconv.Atoi(fields[2])
		pid, err2 := strconv.Atoi(fields[3])
		if err1 != nil || err2 != nil {
			continue
		}
		k := key{fields[1], retried, pid}
		switch fields[0] {
		case "S":
			open[k] = len(out)
			out = append(out, execution{id: k.id, retried: retried, pid: pid})
		case "E":
			if i, ok := open[k]; ok {
				out[i].ended = true
				delete(open, k)
			}
		}
	}
	return out, sc.Err()
}
