package taskstate

// Laying prepared fires out into script calls: each fire's keys and
// arguments on the lean, full or bulk path (named in firelayout.go), the
// calls of a batch cut per queue slot and by size, and the pipeline that
// sends them.

import (
	"context"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/redisscript"
)

// maxFiresPerFlight bounds one pipeline's memory.
const maxFiresPerFlight = 1024

// fireCallSizes: a call of a few fires amortises the round trip and the
// script's fixed cost over its fires, while several calls per pipeline keep
// the server busy as the next call arrives; a large call of fires taken one
// by one makes the server wait for all of it and costs more per fire. A
// bulk call's fixed cost (fences, one read and one write of every
// watermark, one push, one outbox record) is a larger share, and it pays
// to spread it over more fires (figures in docs/benchmarks.md).
var fireCallSizes = callSizes{each: 16, bulk: 64}

// appendFire adds p's keys and arguments to a chunk's KEYS and ARGV, laid
// out as firelayout.go names them: the lean path's when the fire takes it,
// else the full path's.
func appendFire(keys []any, args []any, p preparedFire, nums *numArgs, fa fenceArgs, path firePath) ([]any, []any) {
	f := p.f
	task := p.keys.Task(p.id)
	if path != pathFull && p.lean() {
		var k [leanKeys]string
		k[fireKeyWatermark], k[fireKeyMarker], k[fireKeyTask] = p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task
		var a [leanArgs]any
		a[fireArgKind] = kindLean
		a[fireArgTick] = nums.arg(numTick, f.Tick.UnixMilli())
		a[fireArgExpected] = expectedArg(f, nums)
		a[fireArgConfig], a[fireArgFresh], a[fireArgMaxStale] = fa.config, fa.fresh, fa.maxStale
		a[leanArgMsg] = p.msg
		a[leanArgTaskID] = p.id
		a[leanArgFiredID], a[leanArgFiredData] = f.FiredRecord.ID, f.FiredRecord.Data
		return appendKeys(keys, k[:]), append(args, a[:]...)
	}
	var k [fullKeys]string
	k[fireKeyWatermark], k[fireKeyMarker], k[fireKeyTask] = p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task
	k[fireKeyUnique], k[fireKeyGroup], k[fireKeyTrigger], k[fireKeyFires] = task, task, task, task
	k[fireKeyHeld], k[fireKeyHeldIndex] = task, task
	if f.OverlapBuffer || f.OverlapCancel {
		k[fireKeyHeld], k[fireKeyHeldIndex] = p.own.Held(f.Entry), p.own.HeldIndex()
	}
	limited := f.Kind == FireTick && f.MaxFires > 0
	if limited {
		k[fireKeyFires] = p.own.Fires(f.Entry)
	}
	if f.UniqueTTL > 0 && f.Msg != nil {
		k[fireKeyUnique] = p.keys.Unique(f.Msg.Type, f.Msg.Payload)
	}
	if p.group != "" {
		k[fireKeyGroup] = p.keys.Group(p.group)
	}
	kind := kindTick
	switch f.Kind {
	case FireTrigger:
		kind = kindTrigger
		k[fireKeyTrigger] = p.own.Trigger(f.RequestID)
	case FireBackfill:
		kind = kindBackfill
	case FireSkip:
		kind = kindSkip
	}
	keys = appendKeys(keys, k[:])

	expected := ""
	if (f.Kind == FireTick || f.Kind == FireSkip) && !f.ExpectNone {
		expected = strconv.FormatInt(f.Expected.UnixMilli(), 10)
	}
	var processAt int64
	if !f.ProcessAt.IsZero() {
		processAt = f.ProcessAt.UnixMilli()
	}
	overlap := overlapAllow
	switch {
	case f.OverlapSkip:
		overlap = overlapSkip
	case f.OverlapBuffer:
		overlap = overlapBuffer
	case f.OverlapCancel:
		overlap = overlapCancel
	}
	triggerTTL := f.TriggerTTL
	if triggerTTL == 0 {
		triggerTTL = DefaultTriggerTTL
	}
	var a [fullArgs]any
	a[fireArgKind] = kind
	a[fireArgTick] = strconv.FormatInt(f.Tick.UnixMilli(), 10)
	a[fireArgExpected] = expected
	a[fireArgConfig], a[fireArgFresh], a[fireArgMaxStale] = fa.config, fa.fresh, fa.maxStale
	a[fullArgProcessAt] = strconv.FormatInt(processAt, 10)
	a[fullArgUniqueTTL] = strconv.FormatInt(f.UniqueTTL.Milliseconds(), 10)
	a[fullArgGroup] = p.group
	a[fullArgMsg] = p.msg
	a[fullArgTaskID] = p.id
	a[fullArgOverlap] = overlap
	a[fullArgPrevTask] = f.PrevTaskID
	a[fullArgTriggerTTL] = strconv.FormatInt(max(triggerTTL.Milliseconds(), 1), 10)
	a[fullArgFiredID], a[fullArgFiredData] = f.FiredRecord.ID, f.FiredRecord.Data
	a[fullArgOverlapID], a[fullArgOverlapData] = f.OverlapRecord.ID, f.OverlapRecord.Data
	a[fullArgDuplicateID], a[fullArgDuplicateData] = f.DuplicateRecord.ID, f.DuplicateRecord.Data
	a[fullArgCancelID] = f.CancelRecord.ID
	for i, part := range f.CancelRecord.parts {
		a[fullArgCancelData1+i] = part
	}
	a[fullArgMaxFires], a[fullArgMaxFiresSince] = "0", "0"
	if limited {
		a[fullArgMaxFires] = strconv.Itoa(f.MaxFires)
		a[fullArgMaxFiresSince] = strconv.FormatUint(f.MaxFiresSince, 10)
	}
	a[fullArgSkippedCount] = len(f.SkippedRecords)
	args = append(args, a[:]...)
	for _, r := range f.SkippedRecords {
		args = append(args, r.ID, r.Data)
	}
	return keys, args
}

// firePath chooses the script's paths; only tests force one.
type firePath uint8

const (
	// pathAuto: bulk for a chunk that qualifies, else lean for each plain
	// tick and the full path for the rest.
	pathAuto firePath = iota
	// pathEach: never bulk (lean or full per fire).
	pathEach
	// pathFull: the full path for every fire.
	pathFull
)

// bulkable reports whether a chunk takes the script's bulk path: every fire
// a plain tick (lean), of a different entry (the batch's fences are
// presented once).
func bulkable(fires []*preparedFire) bool {
	for i, p := range fires {
		f := p.f
		if !p.lean() {
			return false
		}
		for _, q := range fires[:i] {
			if q.f.Entry == f.Entry {
				return false
			}
		}
	}
	return true
}

// appendKeys appends each key name of k to keys, a call's KEYS.
func appendKeys(keys []any, k []string) []any {
	for _, key := range k {
		keys = append(keys, key)
	}
	return keys
}

// appendBulk adds a bulkable chunk's keys and arguments in the bulk path's
// layout: the blocks of watermarks, moved-markers and task keys; the
// common fence arguments once, then bulkArgs arguments per fire.
//
// The fires' key names are written into a.keys, and the multi-record of
// their records into a.records, the flight's scratch, and passed as
// slices of it: a burst then makes no string per key or record.
func appendBulk(keys []any, args []any, a *flightArena, fires []*preparedFire, nums *numArgs, fa fenceArgs) ([]any, []any) {
	n := len(fires)
	at := len(keys)
	keys = slices.Grow(keys, 3*n)[:at+3*n]
	names := a.keys
	name := func(from int) []byte { return names[from:len(names):len(names)] }
	for i, p := range fires {
		from := len(names)
		names = p.own.AppendWatermark(names, p.f.Entry)
		keys[at+bulkBlockWatermark*n+i] = name(from)
		from = len(names)
		names = p.own.AppendHandover(names, p.f.Entry)
		keys[at+bulkBlockMarker*n+i] = name(from)
		from = len(names)
		names = p.keys.AppendTask(names, p.id)
		keys[at+bulkBlockTask*n+i] = name(from)
	}
	a.keys = names
	records := &a.records
	from := len(*records)
	recs := append(*records, outbox.MultiRecordTag...)
	for _, p := range fires {
		recs = outbox.AppendFrame(recs, p.f.FiredRecord.ID, p.f.FiredRecord.Data)
	}
	*records = recs
	recs = recs[from:len(recs):len(recs)]
	var head [argBulkFirstFire - argBulk]any
	head[argBulk-argBulk] = kindBulk
	head[argBulkConfig-argBulk] = fa.config
	head[argBulkFresh-argBulk] = fa.fresh
	head[argBulkMaxStale-argBulk] = fa.maxStale
	head[argBulkRecordID-argBulk] = outbox.MultiRecordID(fires[0].f.FiredRecord.ID)
	head[argBulkRecords-argBulk] = recs
	args = append(args, head[:]...)
	for _, p := range fires {
		f := p.f
		var a [bulkArgs]any
		a[bulkArgTick] = nums.arg(numTick, f.Tick.UnixMilli())
		a[bulkArgExpected] = expectedArg(f, nums)
		a[bulkArgMsg] = p.msg
		a[bulkArgTaskID] = p.id
		args = append(args, a[:]...)
	}
	return keys, args
}

func expectedArg(f *Fire, nums *numArgs) any {
	if f.ExpectNone {
		return ""
	}
	return nums.arg(numExpected, f.Expected.UnixMilli())
}

// numArgs remembers the last decimal argument made for each of a few
// numeric fields: in a burst every fire has the same tick and expected
// watermark, and the string and its boxing are then made once instead of
// once per fire.
type numArgs struct {
	set  [2]bool
	val  [2]int64
	args [2]any
}

// Fields numArgs remembers.
const (
	numExpected = iota
	numTick
)

func (n *numArgs) arg(i int, v int64) any {
	if !n.set[i] || n.val[i] != v {
		n.set[i], n.val[i], n.args[i] = true, v, strconv.FormatInt(v, 10)
	}
	return n.args[i]
}

// lean reports whether p takes the fire script's short path: a plain tick
// that enqueues a pending task with nothing else to check or record (a fire
// limit is a check: limited fires take the full path).
func (p preparedFire) lean() bool {
	f := p.f
	return f.Kind == FireTick && !f.OverlapSkip && !f.OverlapBuffer && !f.OverlapCancel && f.UniqueTTL <= 0 && p.group == "" &&
		f.ProcessAt.IsZero() && len(f.SkippedRecords) == 0 && f.MaxFires <= 0
}

// fireCall is one script call: a chunk of fires into one queue.
type fireCall struct {
	prefix  string
	queue   string
	indexes []int // positions in the caller's slice
	fires   []*preparedFire
	bulk    bool // on the script's bulk path
	// args is the whole command: EVALSHA, the script's hash, the number of
	// keys, the keys, the arguments (built once, at its final size).
	args []any
	cmd  *redis.Cmd
}

// callSizes bounds the fires of one script call: a call on the bulk path
// takes up to bulk, any other up to each.
type callSizes struct{ each, bulk int }

// chunkFires groups fires by (prefix, queue) in first-seen order, keeping the
// caller's order inside each group, and cuts each group into calls: runs of
// up to sizes.bulk fires, each one bulk call when it qualifies, else calls
// of up to sizes.each fires.
//
// The calls' commands are laid out in arena (grown as needed), which must
// outlive the calls; fireBatch reuses it from flight to flight.
func chunkFires(prepared []preparedFire, offset int, sizes callSizes, fa fenceArgs, path firePath, arena *flightArena) []*fireCall {
	type slot struct{ prefix, queue string }
	open := make(map[slot]*fireCall)
	var runs []*fireCall
	perRun := max(sizes.each, sizes.bulk)
	for i := range prepared {
		p := &prepared[i]
		key := slot{p.f.Prefix, p.f.Queue}
		if key.prefix == "" {
			key.prefix = DefaultPrefix
		}
		call := open[key]
		if call == nil || len(call.indexes) >= perRun {
			n := min(perRun, len(prepared)-i)
			call = &fireCall{prefix: key.prefix, queue: p.f.Queue, indexes: make([]int, 0, n), fires: make([]*preparedFire, 0, n)}
			open[key] = call
			runs = append(runs, call)
		}
		call.indexes = append(call.indexes, offset+i)
		call.fires = append(call.fires, p)
	}
	calls := make([]*fireCall, 0, len(runs))
	for _, run := range runs {
		// A single fire takes the lean path, which writes its own record.
		run.bulk = path == pathAuto && len(run.fires) > 1 && len(run.fires) <= sizes.bulk && bulkable(run.fires)
		if run.bulk || len(run.fires) <= sizes.each {
			calls = append(calls, run)
			continue
		}
		// Consecutive calls of one queue run in order (one pipeline).
		for from := 0; from < len(run.fires); from += sizes.each {
			to := min(from+sizes.each, len(run.fires))
			calls = append(calls, &fireCall{prefix: run.prefix, queue: run.queue, indexes: run.indexes[from:to:to], fires: run.fires[from:to:to]})
		}
	}
	// Keys and arguments interleave per fire, so each call's are gathered
	// in scratch space and then laid out in one slice.
	var keys []any
	var args []any
	var nums numArgs
	cmds := arena.cmds[:0]
	ends := make([]int, len(calls))
	for c, call := range calls {
		first := call.fires[0]
		own := first.own
		var common [keyFirstFire - 1]string
		common[keyFence-1] = own.Fence()
		common[keyFreshness-1] = own.Freshness()
		common[keyOutbox-1] = own.Outbox()
		common[keyPending-1] = first.keys.Pending()
		common[keyScheduled-1] = first.keys.Scheduled()
		common[keyGroups-1] = first.keys.Groups()
		common[keyFenceID-1] = own.FenceID()
		keys = appendKeys(keys[:0], common[:])
		var head [argFirstFire - 1]any
		head[argTaskPrefix-1] = first.keys.TaskPrefix()
		head[argFires-1] = len(call.fires)
		args = append(args[:0], head[:]...)
		if call.bulk {
			keys, args = appendBulk(keys, args, arena, call.fires, &nums, fa)
		} else {
			for _, p := range call.fires {
				keys, args = appendFire(keys, args, *p, &nums, fa, path)
			}
		}
		cmds = append(cmds, "evalsha", fireScript.Hash(), len(keys))
		cmds = append(cmds, keys...)
		cmds = append(cmds, args...)
		ends[c] = len(cmds)
	}
	// Sliced once the arena is done growing.
	start := 0
	for c, call := range calls {
		call.args = cmds[start:ends[c]:ends[c]]
		start = ends[c]
	}
	arena.cmds = cmds
	return calls
}

// flightArena is the scratch of one flight's commands: the commands, and
// the bytes of the key names and multi-records they pass. None is read
// once the flight's pipeline is written and answered.
type flightArena struct {
	cmds    []any
	keys    []byte
	records []byte
}

// reset empties a for the next flight, keeping its room; the commands are
// cleared so they keep no message or record alive.
func (a *flightArena) reset() {
	clear(a.cmds)
	a.cmds, a.keys, a.records = a.cmds[:0], a.keys[:0], a.records[:0]
}

// preparedBatch is a batch's prepared fires and their encoded messages,
// each fire's msg a slice of msgs: a burst's batches reuse the same few
// buffers instead of allocating a message per fire.
type preparedBatch struct {
	fires []preparedFire
	msgs  []byte
}

// Scratch reused across fire batches (which may run concurrently): a
// flight's commands, and a batch's prepared fires. Each is cleared before
// it goes back, so it keeps no message or record alive; the messages'
// bytes are only read while the batch's calls are sent.
var (
	cmdArenas    = sync.Pool{New: func() any { return new(flightArena) }}
	preparedBufs = sync.Pool{New: func() any { return new(preparedBatch) }}
)

// runFireCalls sends the queue registrations and every call in one pipeline.
// The registrations are plain commands beside the scripts: asynq:queues (so
// the Inspector and CLI see the queue, as asynq's client does before each
// enqueue) and the tenant's set of queues with an outbox (so the relay finds
// every outbox). Re-adding is cheap inside a pipeline, so nothing is cached.
func runFireCalls(ctx context.Context, c redis.UniversalClient, calls []*fireCall) {
	batch := redisscript.NewBatch(c)
	registered := make(map[[2]string]bool)
	for _, call := range calls {
		if slot := [2]string{call.prefix, call.queue}; !registered[slot] {
			registered[slot] = true
			batch.Pipe().SAdd(ctx, AllQueuesKey, call.queue)
			batch.Pipe().SAdd(ctx, OutboxesKey(call.prefix), call.queue)
		}
		// As Script.Cmd builds it, so a cluster client routes it by its
		// first key.
		call.cmd = redis.NewCmd(ctx, call.args...)
		call.cmd.SetFirstKeyPos(3)
		batch.Process(ctx, fireScript, call.cmd)
	}
	batch.Exec(ctx)
}
