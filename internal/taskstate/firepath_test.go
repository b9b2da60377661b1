package taskstate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/outbox"
)

// TestFirePathsAgree runs random chunks of fires against random slot states
// through each of the fire script's paths — bulk (the default for a chunk
// of plain ticks), lean per fire, and the full path — and requires the same
// results and the same Redis state from all three: the short paths are
// optimizations, never different rules.
func TestFirePathsAgree(t *testing.T) {
	t.Parallel()
	s, rc := newTestStore(t)
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const queue = "paths"
	own := Own(testPrefix, queue)
	keys := Keys(queue)
	var bulkChunks int

	for round := range 150 {
		sc := newPathScenario(rng, round)
		if sc.bulk {
			bulkChunks++
		}
		var want []FireResult
		var wantState map[string]string
		for _, path := range []firePath{pathAuto, pathEach, pathFull} {
			if err := rc.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			sc.seed(t, rc, own, keys)
			s.firePath = path
			got, err := s.FireBatch(ctx, sc.fences, sc.fires)
			if err != nil {
				t.Fatalf("round %d path %d: %v", round, path, err)
			}
			state := dumpState(t, rc)
			sc.normalize(t, state, own)
			if path == pathAuto {
				want, wantState = got, state
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d (%s): path %d results\n%+v\nbulk/auto results\n%+v", round, sc, path, got, want)
			}
			if !reflect.DeepEqual(state, wantState) {
				t.Fatalf("round %d (%s): path %d leaves\n%s\nbulk/auto leaves\n%s", round, sc, path, showState(state), showState(wantState))
			}
		}
	}
	s.firePath = pathAuto
	if bulkChunks < 50 {
		t.Fatalf("only %d of 150 rounds were bulk chunks", bulkChunks)
	}
}

// pathScenario is a slot state and a batch of fires into it.
type pathScenario struct {
	desc   []string
	bulk   bool // every chunk qualifies for the bulk path
	fences Fences
	fires  []Fire
	// state to seed
	fence, freshest string
	fenceID         string
	// capped: the fires present a freshness beyond Redis TIME + 2 s, so
	// the stored one is Redis's clock at each run (see normalize).
	capped bool
	marks  map[string]string // key → value
	tasks  []string          // task keys that exist already
}

func (sc *pathScenario) String() string { return strings.Join(sc.desc, ", ") }

func newPathScenario(rng *rand.Rand, round int) *pathScenario {
	const queue = "paths"
	own := Own(testPrefix, queue)
	keys := Keys(queue)
	sc := &pathScenario{marks: map[string]string{}}
	const seq = 10
	switch rng.IntN(5) {
	case 0:
	case 1:
		sc.fence = "9"
	case 2:
		sc.fence = "10"
	case 3:
		sc.fence = "11" // fenced
	case 4:
		sc.fence = "12"
	}
	// The id of the config message at the fence: none (an earlier
	// build), the fence's, a stale one, another message's at that sequence.
	if sc.fence != "" {
		switch rng.IntN(4) {
		case 1:
			sc.fenceID = sc.fence + ":aaaaaaaaaaaa"
		case 2:
			sc.fenceID = "8:bbbbbbbbbbbb"
		case 3:
			sc.fenceID = sc.fence + ":cccccccccccc"
		}
	}
	cid := ""
	if rng.IntN(2) == 0 {
		cid = "aaaaaaaaaaaa" // the fires know the id of their message
	}
	fresh := time.Time{}
	var maxStale time.Duration
	if rng.IntN(3) > 0 {
		fresh = baseTick.Add(time.Hour)
		if rng.IntN(3) == 0 {
			// A replica whose clock runs an hour fast: capped at Redis
			// TIME + 2 s.
			fresh = time.Now().Add(time.Hour)
			sc.capped = true
		}
		maxStale = 30 * time.Second
		switch rng.IntN(6) {
		case 0:
		case 1:
			sc.freshest = fmt.Sprint(fresh.Add(-time.Minute).UnixMilli())
		case 2:
			sc.freshest = fmt.Sprint(fresh.Add(20 * time.Second).UnixMilli())
		case 3:
			sc.freshest = fmt.Sprint(fresh.Add(time.Minute).UnixMilli()) // stale
		case 4, 5:
			// Stored beyond Redis TIME + 2 s (an earlier build, a fast
			// clock): ignored and overwritten.
			sc.freshest = fmt.Sprint(time.Now().Add(time.Duration(1+rng.IntN(120)) * time.Minute).UnixMilli())
		}
		if rng.IntN(4) == 0 {
			maxStale = 0 // records freshness without checking it
		}
	}
	sc.desc = append(sc.desc, fmt.Sprintf("fence id %q config id %q", sc.fenceID, cid))
	sc.desc = append(sc.desc, fmt.Sprintf("fence %q freshest %q fresh %v (capped %v) maxstale %s", sc.fence, sc.freshest, !fresh.IsZero(), sc.capped, maxStale))

	sc.fences = Fences{ConfigSeq: seq, ConfigID: cid, FreshAsOf: fresh, MaxStaleness: maxStale}
	n := 1 + rng.IntN(40)
	sc.bulk = true
	tick := rng.IntN(3) + 2
	for i := range n {
		entry := fmt.Sprintf("r%d-e%d", round, i)
		prev := tickAt(tick - 1)
		if rng.IntN(4) == 0 {
			prev = time.Time{}
		}
		f := tickFire(entry, queue, tickAt(tick), prev)
		if rng.IntN(2) == 0 {
			// An entry with tick_headers: its message carries them.
			f.Msg.Headers = map[string]string{"source": "cron", "cronstream-entry": entry, "cronstream-scheduled-at": tickAt(tick).UTC().Format(time.RFC3339)}
		}
		wm := own.Watermark(entry)
		switch rng.IntN(9) {
		case 6: // as expected, written without a task id (a seeded watermark)
			if !prev.IsZero() {
				sc.marks[wm] = fmt.Sprintf("%d ", prev.UnixMilli())
			}
		case 7: // as expected, without even the space
			if !prev.IsZero() {
				sc.marks[wm] = fmt.Sprint(prev.UnixMilli())
			}
		case 8: // the expected tick's digits followed by more
			sc.marks[wm] = fmt.Sprintf("%d0 %s", prev.UnixMilli(), taskIDFor(entry, prev))
		case 0: // as expected
			if !prev.IsZero() {
				sc.marks[wm] = fmt.Sprintf("%d %s", prev.UnixMilli(), taskIDFor(entry, prev))
			}
		case 1: // another watermark
			sc.marks[wm] = fmt.Sprintf("%d %s", tickAt(tick-2).UnixMilli(), taskIDFor(entry, tickAt(tick-2)))
		case 2: // already at the tick
			sc.marks[wm] = fmt.Sprintf("%d %s", tickAt(tick).UnixMilli(), taskIDFor(entry, tickAt(tick)))
		default:
			if !prev.IsZero() {
				sc.marks[wm] = fmt.Sprintf("%d %s", prev.UnixMilli(), taskIDFor(entry, prev))
			}
		}
		switch rng.IntN(8) {
		case 0:
			sc.marks[own.Handover(entry)] = "7 out"
		case 1:
			sc.marks[own.Handover(entry)] = "7 in"
		}
		if rng.IntN(8) == 0 {
			sc.tasks = append(sc.tasks, keys.Task(f.Msg.ID))
		}
		sc.fires = append(sc.fires, f)
	}
	// Some batches break one of bulk's conditions.
	switch rng.IntN(8) {
	case 0: // the next tick of an entry already in the batch
		i := rng.IntN(n)
		f := tickFire(sc.fires[i].Entry, queue, tickAt(tick+1), tickAt(tick))
		sc.fires = append(sc.fires, f)
		sc.bulk = false
		sc.desc = append(sc.desc, "repeated entry")
	case 1: // a tick that carries its gap's skipped record
		f := &sc.fires[rng.IntN(n)]
		f.SkippedRecords = []Record{record("skipped", f.Entry, f.Tick.Add(-time.Second))}
		sc.bulk = false
		sc.desc = append(sc.desc, "skipped record")
	case 2: // a fire that is not a plain tick
		f := &sc.fires[rng.IntN(n)]
		f.OverlapSkip, f.OverlapRecord = true, record("overlap", f.Entry, f.Tick)
		sc.bulk = false
		sc.desc = append(sc.desc, "overlap fire")
	case 3: // limited fires, one of them with its entry's next tick
		for range 1 + rng.IntN(3) {
			f := &sc.fires[rng.IntN(n)]
			f.MaxFires, f.MaxFiresSince = 1+rng.IntN(2), 5
			switch rng.IntN(4) {
			case 0:
				sc.marks[own.Fires(f.Entry)] = "5 1"
			case 1:
				sc.marks[own.Fires(f.Entry)] = "4 9" // an earlier limit
			case 2:
				sc.marks[own.Fires(f.Entry)] = "6 0" // a later one
			}
		}
		i := rng.IntN(n)
		f := limitedFire(sc.fires[i].Entry, queue, tickAt(tick+1), tickAt(tick), 1+rng.IntN(2), 5)
		sc.fires[i].MaxFires, sc.fires[i].MaxFiresSince = f.MaxFires, 5
		sc.fires = append(sc.fires, f)
		sc.bulk = false
		sc.desc = append(sc.desc, "limited fires")
	}
	sc.desc = append(sc.desc, fmt.Sprintf("%d fires", len(sc.fires)))
	return sc
}

func (sc *pathScenario) seed(t *testing.T, rc *redis.Client, own OwnKeys, keys QueueKeys) {
	t.Helper()
	ctx := context.Background()
	pipe := rc.Pipeline()
	if sc.fence != "" {
		pipe.Set(ctx, own.Fence(), sc.fence, 0)
	}
	if sc.freshest != "" {
		pipe.Set(ctx, own.Freshness(), sc.freshest, 0)
	}
	if sc.fenceID != "" {
		pipe.Set(ctx, own.FenceID(), sc.fenceID, 0)
	}
	for k, v := range sc.marks {
		pipe.Set(ctx, k, v, 0)
	}
	for _, k := range sc.tasks {
		pipe.HSet(ctx, k, "msg", "earlier", "state", "completed")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// normalize replaces a stored freshness near the test's clock (the Redis
// server runs on this host), which is one capped at Redis TIME + 2 s and
// differs from run to run, by "capped". A seeded value the fires left alone
// is far from now and stays as it is.
func (sc *pathScenario) normalize(t *testing.T, state map[string]string, own OwnKeys) {
	t.Helper()
	k := "string " + own.Freshness()
	v, ok := state[k]
	if !sc.capped || !ok {
		return
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("stored freshness %q: %v", v, err)
	}
	if d := time.UnixMilli(ms).Sub(time.Now()); d > -30*time.Second && d < 30*time.Second {
		state[k] = "capped"
	}
}

// dumpState reads every key: strings and lists as they are, hashes with
// pending_since reduced to "set" (it is Redis's clock), sets sorted, zsets
// with scores, streams' entries without their ids.
func dumpState(t *testing.T, rc *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		typ, err := rc.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = rc.Get(ctx, k).Result()
		case "list":
			v, err = rc.LRange(ctx, k, 0, -1).Result()
		case "hash":
			var h map[string]string
			h, err = rc.HGetAll(ctx, k).Result()
			if _, ok := h["pending_since"]; ok {
				h["pending_since"] = "set"
			}
			v = h
		case "set":
			var m []string
			m, err = rc.SMembers(ctx, k).Result()
			sort.Strings(m)
			v = m
		case "zset":
			v, err = rc.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "stream":
			var msgs []redis.XMessage
			// A multi-record counts as its framed records (the bulk path
			// writes one per call where the others write one per fire).
			msgs, err = rc.XRange(ctx, k, "-", "+").Result()
			var vals []map[string]any
			for _, m := range msgs {
				data, _ := m.Values["data"].(string)
				if outbox.FormOf([]byte(data)) != outbox.RecordMulti {
					vals = append(vals, m.Values)
					continue
				}
				frames, ferr := outbox.SplitMulti([]byte(data))
				if ferr != nil || len(frames) < 2 || m.Values["id"] != outbox.MultiRecordID(frames[0].ID) {
					t.Fatalf("multi-record %v: %d frames, %v", m.Values["id"], len(frames), ferr)
				}
				for _, f := range frames {
					vals = append(vals, map[string]any{"id": f.ID, "data": string(f.Data)})
				}
			}
			v = vals
		default:
			t.Fatalf("key %q of type %s", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		out[typ+" "+k] = fmt.Sprint(v)
	}
	return out
}

func showState(m map[string]string) string {
	lines := make([]string, 0, len(m))
	for k, v := range m {
		lines = append(lines, k+" = "+v)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
