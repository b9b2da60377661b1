package taskstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the firing side of the package: one atomic script per queue
// slot that decides whether a tick may fire, creates the asynq task exactly as
// asynq's client would, records the outcome in the queue's outbox and moves the
// entry's watermark, all in one step (docs/design.md INV-watermark, INV-outbox).

// Freshness is the STRING holding the highest fresh_as_of (unix ms) any fire
// into this slot has presented (the staleness fence).
func (o OwnKeys) Freshness() string { return o.head + "fresh" }

// FireKind says which rules a fire follows.
type FireKind uint8

const (
	// FireTick is a scheduled tick: compare-and-set on the entry's watermark,
	// which it advances to the tick.
	FireTick FireKind = iota
	// FireTrigger is a manual trigger: idempotent per request id, never moves
	// the watermark.
	FireTrigger
	// FireBackfill fires a past tick that has no fired event: idempotent by
	// task id (StatusAlreadyExists is success), never moves the watermark.
	FireBackfill
	// FireSkip creates no task: it records missed ticks the catch-up policy
	// drops (SkippedRecords) and advances the watermark to Tick, under the
	// same compare-and-set and fences as FireTick, so the skipped events are
	// written when the ticks are missed rather than with the next fire.
	FireSkip
)

func (k FireKind) String() string {
	switch k {
	case FireTick:
		return "tick"
	case FireTrigger:
		return "trigger"
	case FireBackfill:
		return "backfill"
	case FireSkip:
		return "skip"
	}
	return "FireKind(" + strconv.Itoa(int(k)) + ")"
}

// Record is one outbox record: an already-encoded CloudEvent and its event id,
// which the relay later uses as Nats-Msg-Id.
type Record struct {
	ID   string
	Data []byte
}

func (r Record) empty() bool { return r.ID == "" && len(r.Data) == 0 }

// Fire is one request to enqueue an entry's task for one tick.
type Fire struct {
	// Prefix is the tenant prefix of cronstream's own keys ("" = DefaultPrefix).
	Prefix string
	// Entry is the entry id; Queue the asynq queue the task goes to.
	Entry string
	Queue string
	Kind  FireKind
	// Tick is the scheduled time being fired. For FireTick it becomes the
	// watermark. Watermarks keep millisecond precision.
	Tick time.Time
	// Expected is the watermark the caller believes is stored: the entry's
	// previous fired or skipped tick in this slot. ExpectNone says the entry
	// never fired in this slot. Only FireTick compares them.
	Expected   time.Time
	ExpectNone bool
	// ConfigSeq is the projection's config stream sequence (revision fence).
	// Sequences above 2^53 lose precision inside the script. ConfigID is
	// the id of the config message at ConfigSeq (events.ConfigMessageID),
	// stored with the fence when this fire raises it; "" stores none.
	ConfigSeq uint64
	ConfigID  string
	// FreshAsOf is when this replica's projection last heard the config
	// stream; MaxStaleness how far it may lag the freshest replica firing
	// into this slot. A zero FreshAsOf presents nothing and is not checked;
	// a zero MaxStaleness records FreshAsOf without checking it.
	FreshAsOf    time.Time
	MaxStaleness time.Duration
	// ProcessAt, when later than Redis's clock at the moment of the fire,
	// schedules the task (asynq's Schedule) instead of enqueuing it.
	ProcessAt time.Time
	// Msg is the task message. Msg.Queue may be empty (it is set to Queue);
	// Msg.GroupKey selects asynq's AddToGroup; Msg.UniqueKey is derived when
	// UniqueTTL is set. Msg is not modified.
	Msg *TaskMessage
	// UniqueTTL > 0 takes asynq's unique lock (at least one second).
	UniqueTTL time.Duration
	// OverlapSkip skips the tick while the previous task (PrevTaskID, or the
	// task id stored with the watermark when empty) is still pending,
	// scheduled, retrying, active or aggregating.
	OverlapSkip bool
	PrevTaskID  string
	// RequestID makes a FireTrigger idempotent for TriggerTTL (default 24h);
	// derive the trigger's Msg.ID from it, so a retried trigger is also the
	// same task.
	RequestID  string
	TriggerTTL time.Duration
	// SkippedRecords are the skipped records of a gap the caller resolved by
	// catch-up policy; they are appended before the outcome's record whenever
	// the fire is not refused.
	SkippedRecords []Record
	// FiredRecord is appended when the task is created (required).
	FiredRecord Record
	// OverlapRecord is appended when OverlapSkip skips the tick (required
	// with OverlapSkip).
	OverlapRecord Record
	// DuplicateRecord is appended when asynq's unique lock is held by
	// another task (required with UniqueTTL).
	DuplicateRecord Record
}

// DefaultTriggerTTL is how long a trigger's request id is remembered.
const DefaultTriggerTTL = 24 * time.Hour

// FireStatus is the outcome of one fire.
type FireStatus int

const (
	// StatusFired: the task was created and the fired record appended.
	StatusFired FireStatus = iota + 1
	// StatusAlreadyExists: the task id already exists (or the trigger's
	// request id was already served). Nothing was created and no fired record
	// appended. For a tick, the watermark still advanced and the gap's
	// skipped records were appended (the watermark moves past those ticks, so
	// their skipped events must exist; event ids make a repeat harmless).
	// For a backfill this is success: the tick already fired.
	StatusAlreadyExists
	// StatusDuplicate: asynq's unique lock is held by another task; the
	// duplicate record was appended and a tick's watermark advanced.
	StatusDuplicate
	// StatusSkippedOverlap: the previous task is still running; the overlap
	// record was appended and a tick's watermark advanced.
	StatusSkippedOverlap
	// StatusSkippedMissed: a FireSkip recorded its skipped records and
	// advanced the watermark.
	StatusSkippedMissed
	// StatusWatermarkMismatch: the stored watermark is not the expected one.
	// FireResult carries the current one; recompute and retry.
	StatusWatermarkMismatch
	// StatusMoved: the entry was handed over to another queue; FireResult
	// carries the revision of the move and this slot's last watermark.
	StatusMoved
	// StatusRevisionFenced: another replica already fired into this slot
	// from a newer configuration; FireResult.Fence is its sequence.
	StatusRevisionFenced
	// StatusStale: this replica's projection lags the freshest one seen in
	// this slot by more than MaxStaleness; FireResult.FreshestAsOf says by
	// how much.
	StatusStale
)

var statusNames = map[FireStatus]string{
	StatusFired:             "fired",
	StatusAlreadyExists:     "already-exists",
	StatusDuplicate:         "duplicate",
	StatusSkippedOverlap:    "skipped-overlap",
	StatusSkippedMissed:     "skipped-missed",
	StatusWatermarkMismatch: "watermark-mismatch",
	StatusMoved:             "moved",
	StatusRevisionFenced:    "revision-fenced",
	StatusStale:             "stale",
}

func (s FireStatus) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "FireStatus(" + strconv.Itoa(int(s)) + ")"
}

// Refused reports whether the fire changed nothing because one of its
// preconditions failed.
func (s FireStatus) Refused() bool { return s >= StatusWatermarkMismatch }

// FireResult is what one fire did.
type FireResult struct {
	Status FireStatus
	// TaskID is the created task (Fired), the existing one (AlreadyExists;
	// for a trigger the task its request id first fired), the previous task
	// still running (SkippedOverlap), or the unique lock's holder (Duplicate).
	TaskID string
	// State is the created task's asynq state: pending, scheduled or
	// aggregating.
	State string
	// Watermark is the slot's watermark after the fire (for refusals: the
	// current one). HasWatermark is false when the entry never fired here.
	Watermark       time.Time
	WatermarkTaskID string
	HasWatermark    bool
	// Fence is the slot's highest config sequence (StatusRevisionFenced);
	// FenceID the id of the config message stored with it ("" unknown).
	Fence   uint64
	FenceID string
	// MovedAt is the revision the entry left this queue at (StatusMoved).
	MovedAt uint64
	// FreshestAsOf is the freshest fresh_as_of seen in the slot (StatusStale).
	FreshestAsOf time.Time
	// Err is set when this fire's outcome is unknown because Redis failed;
	// retrying the same fire is safe.
	Err error
}

// Errors callers branch on.
var (
	// ErrInvalidFire reports a Fire that cannot be sent (missing fields,
	// inconsistent queue, missing records).
	ErrInvalidFire = errors.New("invalid fire")
)

// Script return codes, mirrored in fireScript.
const (
	codeFired         = 1
	codeExists        = 2
	codeDuplicate     = 3
	codeOverlap       = 4
	codeSkipped       = 5
	codeMismatch      = -1
	codeMoved         = -2
	codeFenced        = -3
	codeStale         = -4
	maxFiresPerCall   = 16
	maxFiresPerFlight = 1024
)

// maxFiresPerCall was chosen with BenchmarkFireOnce on a 2-core machine: 8–16
// fires per script call, several calls per pipeline, beat both one call per
// fire in a pipeline (~30% fewer fires/s, more Redis time per fire) and larger
// calls (64–256 fires: the server idles until a whole call has arrived and
// spends more time per fire). maxFiresPerFlight bounds one pipeline's memory.

// fireScript fires a chunk of fires that all go to one queue, in order. A fire
// later in the chunk sees the effects of earlier ones, so consecutive ticks of
// one entry (catch-up "all") may share a call.
//
// KEYS (common): 1 fence, 2 freshness, 3 outbox, 4 pending, 5 scheduled,
// 6 groups, 7 fence id. Then per fire: watermark, moved-marker, task, unique lock, group
// zset, trigger key. Unused per-fire keys are the fire's task key (a real key
// of the same slot: Redis Cluster rejects empty names).
//
// ARGV (common): 1 task-key prefix, 2 number of fires. Then per fire:
//
//	1 kind (t tick, r trigger, b backfill, s skip)   2 tick ms   3 expected ms ("" = none)
//	4 config seq ("<seq>" or "<seq>:<config message id>")
//	5 fresh_as_of ms ("" = not presented)   6 max staleness ms
//	7 process_at ms (0 = now)   8 unique ttl ms (0 = none)   9 group
//	10 msg   11 task id   12 overlap-skip (1/0)   13 previous task id
//	14 trigger ttl ms   15/16 fired record   17/18 overlap record
//	19/20 duplicate record   21 n skipped records, then n id/data pairs.
//
// Returns one array per fire: {code, watermark ms, watermark task id, extra,
// task id, state}; extra is the fence, moved revision or freshest ms.
//
// Two short paths take fewer keys and arguments: lean ('T' as a fire's kind:
// a plain tick, 10 arguments and 3 keys) and bulk ('B' in ARGV[3]: a whole
// chunk of plain ticks of different entries presenting the same fences,
// laid out as described at bulk()). Both answer a bare 1 for "fired,
// pending". TestFirePathsAgree holds them to the full path's results and
// writes.
//
// Order of checks: moved marker, revision fence, staleness fence, watermark
// CAS, trigger request id, then (before any write) task id conflict, overlap,
// unique lock. Every check reads; writes come after the checks passed, so a
// refusal writes nothing except raising the fences, which only ever record
// what some replica truthfully presented.
//
// Why the staleness fence compares fires with each other and not with Redis
// TIME: fresh_as_of is when a replica's projection last heard the config
// stream. The slot keeps the highest fresh_as_of any fire has presented. A
// replica that lags it by more than max staleness either lost the stream while
// another replica still hears it, or stalled (GC, VM pause) while others moved
// on — in both cases a config change may have been published that it has not
// seen, so it must not fire. When nobody hears NATS, nobody can publish a
// change either (INV-staleness-fence in docs/design.md): every replica's fresh_as_of stops at
// about the same instant, none lags the maximum, and all keep firing on the
// last known configuration. A comparison with Redis TIME would instead stop
// every replica during a NATS outage, which is exactly what INV-staleness-fence
// forbids. Redis TIME only bounds what is believed: a freshness more than 2 s
// ahead of it is capped there (presented) or ignored (stored), so a replica
// whose clock runs fast cannot make every other replica's fires stale.
var fireScript = redis.NewScript(fireScriptSrc)

const fireScriptSrc = `
local t = redis.call('TIME')
local now_s = t[1]
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_ns = t[1] .. string.format('%06d', tonumber(t[2])) .. '000'
local task_prefix = ARGV[1]
local nfires = tonumber(ARGV[2])
local busy = {pending=true, scheduled=true, retry=true, active=true, aggregating=true}
-- The fences are read once per call and written when raised.
local fence = redis.call('GET', KEYS[1])
local freshest = redis.call('GET', KEYS[2])
-- fence_ref is "<seq>:<id>" when the fence id key names the fence's
-- message, else just the fence (an earlier build raised it, or no fire
-- presented an id).
local fence_ref = fence
if fence then
  local fid = redis.call('GET', KEYS[7])
  if fid and string.match(fid, '^(%d+)') == fence then fence_ref = fid end
end
-- No freshness is believed more than 2 s ahead of Redis's clock: a presented
-- one is capped there before it is compared or stored, and a stored one
-- beyond it (left by a replica with a fast clock, or an earlier build) counts
-- as absent and is overwritten by the next fire that presents one.
local fresh_cap = now_ms + 2000
if freshest and tonumber(freshest) > fresh_cap then freshest = nil end

local function split(v) -- "<a> <b>": watermark "<ms> <task>", marker "<rev> <in|out>"
  if not v then return nil, nil end
  local sp = string.find(v, ' ', 1, true)
  if not sp then return v, '' end
  return string.sub(v, 1, sp - 1), string.sub(v, sp + 1)
end

-- res builds one fire's reply; a nil would cut a Lua array short.
local function res(code, wm, wmtask, extra, taskid, state)
  return {code, wm or '', wmtask or '', extra or '', taskid or '', state or ''}
end

local function append(from, n)
  for i = 0, n - 1 do
    redis.call('XADD', KEYS[3], '*', 'id', ARGV[from + 2*i], 'data', ARGV[from + 2*i + 1])
  end
end

-- fences checks a fire presenting config sequence seq, freshness fresh
-- ("" = not presented) and staleness bound maxstale against the revision
-- fence and the staleness fence, raising each one it passes. It returns the
-- refusal's code and extra, or nil. Calling it again with the same arguments
-- gives the same answer and writes nothing.
local function fences(seq, fresh, maxstale)
  local ref = seq
  seq = string.match(ref, '^(%d+)')
  if fence and tonumber(seq) < tonumber(fence) then return -3, fence_ref end
  if not fence or tonumber(seq) > tonumber(fence) then
    fence, fence_ref = seq, seq
    redis.call('SET', KEYS[1], seq)
  end
  -- The fence's message id, when this fire knows it and it is not the one
  -- stored (none, or another stream's message at the same sequence: the
  -- fire read its message from the stream it follows).
  if ref ~= seq and fence_ref ~= ref and tonumber(seq) == tonumber(fence) then
    fence_ref = ref
    redis.call('SET', KEYS[7], ref)
  end
  if fresh ~= '' then
    if tonumber(fresh) > fresh_cap then fresh = string.format('%d', fresh_cap) end
    maxstale = tonumber(maxstale)
    if freshest and maxstale > 0 and tonumber(fresh) < tonumber(freshest) - maxstale then
      return -4, freshest
    end
    if not freshest or tonumber(fresh) > tonumber(freshest) then
      freshest = fresh
      redis.call('SET', KEYS[2], fresh)
    end
  end
  return nil
end

-- gate reads the fire's watermark and moved-marker (KEYS k, k+1) and makes
-- the checks every fire passes first: moved marker, then the fences (ARGV
-- a+3 to a+5). It returns the watermark and, when the fire is refused, its
-- reply.
local function gate(k, a)
  local v = redis.call('MGET', KEYS[k], KEYS[k+1])
  local wm, wmtask = split(v[1])
  local rev, dir = split(v[2])
  if dir == 'out' then return wm, wmtask, res(-2, wm, wmtask, rev) end
  local code, extra = fences(ARGV[a+3], ARGV[a+4], ARGV[a+5])
  if code then return wm, wmtask, res(code, wm, wmtask, extra) end
  return wm, wmtask, nil
end

-- mismatch is the watermark compare-and-set's refusal (nil when the
-- watermark is the expected one, "" = none).
local function mismatch(wm, wmtask, expected)
  if (expected == '' and wm) or (expected ~= '' and wm ~= expected) then
    return res(-1, wm, wmtask)
  end
  return nil
end

local function fire(k, a)
  local kind, tick, expected = ARGV[a], ARGV[a+1], ARGV[a+2]
  local kwm, ktask, ktrigger = KEYS[k], KEYS[k+2], KEYS[k+5]

  local wm, wmtask, refused = gate(k, a)
  if refused then return refused end

  if kind == 't' or kind == 's' then
    refused = mismatch(wm, wmtask, expected)
    if refused then return refused end
    if kind == 's' then
      -- A skip keeps the last fired task id for overlap checks.
      append(a + 21, tonumber(ARGV[a+20]))
      redis.call('SET', kwm, tick .. ' ' .. (wmtask or ''))
      return res(5, tick, wmtask or '')
    end
  elseif kind == 'r' then
    local served = redis.call('GET', ktrigger)
    if served then return res(2, wm, wmtask, '', served) end
  end

  local id = ARGV[a+10]
  -- Checks done; from here every outcome appends the gap's skipped records
  -- and its own record, moves a tick's watermark and remembers a trigger's
  -- request id.
  local code, rec, wm_task, taskid, state
  if redis.call('EXISTS', ktask) == 1 then
    code, wm_task, taskid = 2, id, id
  end

  if not code and ARGV[a+11] == '1' then
    local prev = ARGV[a+12]
    if prev == '' then prev = wmtask or '' end
    if prev ~= '' then
      local st = redis.call('HGET', task_prefix .. prev, 'state')
      if st and busy[st] then
        code, rec, wm_task, taskid, state = 4, a + 16, prev, prev, st
      end
    end
  end

  if not code then
    local process_at, uttl = tonumber(ARGV[a+6]), tonumber(ARGV[a+7])
    local delayed = process_at > now_ms
    local kunique = KEYS[k+3]
    if uttl > 0 then
      local ttl_s
      if delayed then
        ttl_s = math.floor((process_at + uttl - now_ms) / 1000)
      else
        ttl_s = math.floor(uttl / 1000)
      end
      if ttl_s < 1 then ttl_s = 1 end
      if not redis.call('SET', kunique, id, 'NX', 'EX', string.format('%d', ttl_s)) then
        code, rec, wm_task, taskid = 3, a + 18, wmtask or '', redis.call('GET', kunique)
      end
    end
    if not code then
      local msg, group = ARGV[a+9], ARGV[a+8]
      if delayed then
        -- asynq's Schedule(Unique): no pending_since, and no group field
        -- even when the message has a group (the forwarder then sends it
        -- to pending).
        state = 'scheduled'
        if uttl > 0 then
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'unique_key', kunique)
        else
          redis.call('HSET', ktask, 'msg', msg, 'state', state)
        end
        redis.call('ZADD', KEYS[5], string.format('%d', math.floor(process_at / 1000)), id)
      elseif group ~= '' then
        -- asynq's AddToGroup(Unique): the unique variant writes no unique_key.
        state = 'aggregating'
        redis.call('HSET', ktask, 'msg', msg, 'state', state, 'group', group)
        redis.call('ZADD', KEYS[k+4], now_s, id)
        redis.call('SADD', KEYS[6], group)
      else
        state = 'pending'
        if uttl > 0 then
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'pending_since', now_ns, 'unique_key', kunique)
        else
          redis.call('HSET', ktask, 'msg', msg, 'state', state, 'pending_since', now_ns)
        end
        redis.call('LPUSH', KEYS[4], id)
      end
      code, rec, wm_task, taskid = 1, a + 14, id, id
    end
  end

  append(a + 21, tonumber(ARGV[a+20]))
  if rec then append(rec, 1) end
  if kind == 't' then
    redis.call('SET', kwm, tick .. ' ' .. wm_task)
    wm, wmtask = tick, wm_task
  elseif kind == 'r' then
    redis.call('SET', ktrigger, taskid or '', 'PX', ARGV[a+13])
  end
  return res(code, wm, wmtask, '', taskid, state)
end

-- lean is fire() for a plain tick ('T'): no overlap check, no unique lock,
-- no group, no delay, no skipped records; it takes 10 arguments and 3 keys
-- (watermark, moved-marker, task) and answers 1 for "fired, pending"
-- instead of a row. Its checks (gate, mismatch) and writes are fire()'s for
-- such a tick, and the LPUSHes of consecutive lean fires are made as one
-- (flush, before any other fire and at the end: the list gets the same ids
-- in the same order, in the same atomic step). Measured with
-- BenchmarkFireOnce (batch-16, 20 iterations) when it came: Redis CPU per
-- fire 15.7 µs before, 11.2–13.8 µs after.
local pushed = {}
local function flush()
  if #pushed > 0 then
    redis.call('LPUSH', KEYS[4], unpack(pushed))
    pushed = {}
  end
end

local function lean(k, a)
  local tick, expected = ARGV[a+1], ARGV[a+2]
  local kwm, ktask = KEYS[k], KEYS[k+2]
  local wm, wmtask, refused = gate(k, a)
  if refused then return refused end
  refused = mismatch(wm, wmtask, expected)
  if refused then return refused end

  local id = ARGV[a+7]
  if redis.call('EXISTS', ktask) == 1 then
    redis.call('SET', kwm, tick .. ' ' .. id)
    return res(2, tick, id, '', id)
  end
  redis.call('HSET', ktask, 'msg', ARGV[a+6], 'state', 'pending', 'pending_since', now_ns)
  pushed[#pushed + 1] = id
  redis.call('XADD', KEYS[3], '*', 'id', ARGV[a+8], 'data', ARGV[a+9])
  redis.call('SET', kwm, tick .. ' ' .. id)
  return 1
end

-- holds reports whether the stored watermark value v ("<ms> <task>", or
-- false when absent) is at tick expected ("" = none): mismatch's test
-- without cutting v into new strings.
local function holds(v, expected)
  if expected == '' then return not v end
  if not v then return false end
  local n = #expected
  return string.sub(v, 1, n) == expected and (#v == n or string.byte(v, n + 1) == 32)
end

-- bulk fires a chunk of plain ticks ('B' in ARGV[3]): lean's fires, each
-- of a different entry, all presenting the config sequence, freshness and
-- staleness bound in ARGV[4..6]. KEYS from 8: the n watermarks, the n
-- moved-markers, the n task keys. ARGV from 7, six per fire: tick, expected,
-- msg, task id, fired record id and data. The fires touch disjoint keys and
-- present the same fences (decided once, at the first fire that passes its
-- marker, as lean would), so reading every watermark and marker first and
-- writing every watermark last gives each fire lean's outcome and leaves the
-- same state, with three commands per fire instead of five. Measured when it
-- came (SameInstant100k, three runs each): Redis CPU per 100,000 fires
-- 1.32–1.64 s before, 0.98–1.19 s after.
local function bulk(n)
  local v = redis.call('MGET', unpack(KEYS, 8, 7 + 2 * n))
  local out, marks, gated, code, extra = {}, {}, false, nil, nil
  for i = 1, n do
    local a, rev, dir = 1 + 6 * i, split(v[n + i])
    if dir == 'out' then
      local wm, wmtask = split(v[i])
      out[i] = res(-2, wm, wmtask, rev)
    else
      if not gated then
        gated = true
        code, extra = fences(ARGV[4], ARGV[5], ARGV[6])
      end
      if code then
        local wm, wmtask = split(v[i])
        out[i] = res(code, wm, wmtask, extra)
      elseif not holds(v[i], ARGV[a + 1]) then
        local wm, wmtask = split(v[i])
        out[i] = res(-1, wm, wmtask)
      else
        local tick, id, ktask = ARGV[a], ARGV[a + 3], KEYS[7 + 2 * n + i]
        if redis.call('EXISTS', ktask) == 1 then
          out[i] = res(2, tick, id, '', id)
        else
          redis.call('HSET', ktask, 'msg', ARGV[a + 2], 'state', 'pending', 'pending_since', now_ns)
          pushed[#pushed + 1] = id
          redis.call('XADD', KEYS[3], '*', 'id', ARGV[a + 4], 'data', ARGV[a + 5])
          out[i] = 1
        end
        marks[#marks + 1] = KEYS[7 + i]
        marks[#marks + 1] = tick .. ' ' .. id
      end
    end
  end
  flush()
  if #marks > 0 then redis.call('MSET', unpack(marks)) end
  return out
end

if ARGV[3] == 'B' then return bulk(nfires) end

local out = {}
local k, a = 8, 3
for i = 1, nfires do
  if ARGV[a] == 'T' then
    out[i] = lean(k, a)
    a = a + 10
    k = k + 3
  else
    flush()
    out[i] = fire(k, a)
    a = a + 21 + 2 * tonumber(ARGV[a + 20])
    k = k + 6
  end
end
flush()
return out
`

// preparedFire is a validated fire with its encoded message.
type preparedFire struct {
	f     *Fire
	msg   []byte
	id    string
	group string
	own   OwnKeys
	keys  QueueKeys
}

// prepareSkip validates a FireSkip, which carries no task.
func prepareSkip(f *Fire, bad func(string, ...any) (preparedFire, error)) (preparedFire, error) {
	switch {
	case f.Tick.IsZero():
		return bad("zero tick")
	case !f.ExpectNone && f.Expected.IsZero():
		return bad("no expected watermark (set ExpectNone for an entry that never fired)")
	case !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli():
		return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
	case len(f.SkippedRecords) == 0:
		return bad("a skip without skipped records")
	case f.MaxStaleness < 0:
		return bad("negative duration")
	case f.ConfigSeq > 1<<53:
		return bad("config sequence %d above 2^53", f.ConfigSeq)
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	// The per-fire task keys are never touched by a skip; the queue's task
	// key prefix stands in for them (a real key name of the same slot).
	return preparedFire{f: f, keys: Keys(f.Queue)}, nil
}

// prepare validates f and encodes its message.
func prepare(f *Fire) (preparedFire, error) {
	bad := func(format string, args ...any) (preparedFire, error) {
		return preparedFire{}, fmt.Errorf("%w: entry %q tick %s: %s", ErrInvalidFire, f.Entry, f.Tick.UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
	}
	if f.Entry == "" {
		return bad("empty entry id")
	}
	if f.Queue == "" {
		return bad("empty queue")
	}
	if f.Kind == FireSkip {
		return prepareSkip(f, bad)
	}
	if f.Msg == nil {
		return bad("no task message")
	}
	if strings.TrimSpace(f.Msg.Type) == "" {
		return bad("blank task type")
	}
	if f.Msg.ID == "" {
		return bad("empty task id")
	}
	if f.Msg.Queue != "" && f.Msg.Queue != f.Queue {
		return bad("message queue %q differs from fire queue %q", f.Msg.Queue, f.Queue)
	}
	if f.Tick.IsZero() {
		return bad("zero tick")
	}
	switch f.Kind {
	case FireTick:
		if !f.ExpectNone && f.Expected.IsZero() {
			return bad("no expected watermark (set ExpectNone for an entry that never fired)")
		}
		if !f.ExpectNone && f.Tick.UnixMilli() <= f.Expected.UnixMilli() {
			return bad("tick is not after the expected watermark %s", f.Expected.UTC().Format(time.RFC3339Nano))
		}
	case FireTrigger:
		if f.RequestID == "" {
			return bad("trigger without request id")
		}
	case FireBackfill:
	default:
		return bad("unknown kind %d", f.Kind)
	}
	if f.UniqueTTL != 0 && f.UniqueTTL < time.Second {
		return bad("unique TTL %s is below asynq's minimum of 1s", f.UniqueTTL)
	}
	if f.MaxStaleness < 0 || f.TriggerTTL < 0 {
		return bad("negative duration")
	}
	if f.ConfigSeq > 1<<53 {
		return bad("config sequence %d above 2^53", f.ConfigSeq)
	}
	if err := checkRecord("fired", f.FiredRecord, true); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("overlap", f.OverlapRecord, f.OverlapSkip); err != nil {
		return bad("%v", err)
	}
	if err := checkRecord("duplicate", f.DuplicateRecord, f.UniqueTTL > 0); err != nil {
		return bad("%v", err)
	}
	for i, r := range f.SkippedRecords {
		if err := checkRecord(fmt.Sprintf("skipped[%d]", i), r, true); err != nil {
			return bad("%v", err)
		}
	}
	keys := Keys(f.Queue)
	msg := *f.Msg
	msg.Queue = f.Queue
	if f.UniqueTTL > 0 {
		msg.UniqueKey = keys.Unique(msg.Type, msg.Payload)
	}
	enc, err := EncodeTaskMessage(&msg)
	if err != nil {
		return bad("%v", err)
	}
	return preparedFire{f: f, msg: enc, id: msg.ID, group: msg.GroupKey, keys: keys}, nil
}

func checkRecord(name string, r Record, required bool) error {
	if r.empty() {
		if required {
			return fmt.Errorf("missing %s record", name)
		}
		return nil
	}
	if r.ID == "" || len(r.Data) == 0 {
		return fmt.Errorf("%s record needs both an event id and data", name)
	}
	return nil
}

// appendFire adds p's keys and arguments to a chunk's KEYS and ARGV.
func appendFire(keys []string, args []any, p preparedFire, nums *numArgs, path firePath) ([]string, []any) {
	f := p.f
	task := p.keys.Task(p.id)
	if path != pathFull && p.lean() {
		keys = append(keys, p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task)
		return keys, append(args,
			"T",
			nums.arg(2, f.Tick.UnixMilli()),
			expectedArg(f, nums),
			nums.configArg(f),
			freshArg(f, nums),
			nums.arg(4, f.MaxStaleness.Milliseconds()),
			p.msg,
			p.id,
			f.FiredRecord.ID, f.FiredRecord.Data,
		)
	}
	unique, group, trigger := task, task, task
	if f.UniqueTTL > 0 && f.Msg != nil {
		unique = p.keys.Unique(f.Msg.Type, f.Msg.Payload)
	}
	if p.group != "" {
		group = p.keys.Group(p.group)
	}
	kind := "t"
	switch f.Kind {
	case FireTrigger:
		kind = "r"
		trigger = p.own.Trigger(f.RequestID)
	case FireBackfill:
		kind = "b"
	case FireSkip:
		kind = "s"
	}
	keys = append(keys, p.own.Watermark(f.Entry), p.own.Handover(f.Entry), task, unique, group, trigger)

	expected := ""
	if (f.Kind == FireTick || f.Kind == FireSkip) && !f.ExpectNone {
		expected = strconv.FormatInt(f.Expected.UnixMilli(), 10)
	}
	fresh := ""
	if !f.FreshAsOf.IsZero() {
		fresh = strconv.FormatInt(f.FreshAsOf.UnixMilli(), 10)
	}
	var processAt int64
	if !f.ProcessAt.IsZero() {
		processAt = f.ProcessAt.UnixMilli()
	}
	overlap := "0"
	if f.OverlapSkip {
		overlap = "1"
	}
	triggerTTL := f.TriggerTTL
	if triggerTTL == 0 {
		triggerTTL = DefaultTriggerTTL
	}
	args = append(args,
		kind,
		strconv.FormatInt(f.Tick.UnixMilli(), 10),
		expected,
		nums.configArg(f),
		fresh,
		strconv.FormatInt(f.MaxStaleness.Milliseconds(), 10),
		strconv.FormatInt(processAt, 10),
		strconv.FormatInt(f.UniqueTTL.Milliseconds(), 10),
		p.group,
		p.msg,
		p.id,
		overlap,
		f.PrevTaskID,
		strconv.FormatInt(max(triggerTTL.Milliseconds(), 1), 10),
		f.FiredRecord.ID, f.FiredRecord.Data,
		f.OverlapRecord.ID, f.OverlapRecord.Data,
		f.DuplicateRecord.ID, f.DuplicateRecord.Data,
		len(f.SkippedRecords),
	)
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
// a plain tick (lean), of a different entry, presenting the same config
// sequence, freshness and staleness bound.
func bulkable(fires []*preparedFire) bool {
	first := fires[0].f
	for i, p := range fires {
		f := p.f
		if !p.lean() || f.ConfigSeq != first.ConfigSeq || f.ConfigID != first.ConfigID || f.FreshAsOf.IsZero() != first.FreshAsOf.IsZero() ||
			f.FreshAsOf.UnixMilli() != first.FreshAsOf.UnixMilli() || f.MaxStaleness.Milliseconds() != first.MaxStaleness.Milliseconds() {
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

// appendBulk adds a bulkable chunk's keys and arguments in the bulk path's
// layout: the watermarks, then the moved-markers, then the task keys; the
// common fence arguments once, then six arguments per fire.
func appendBulk(keys []string, args []any, fires []*preparedFire, nums *numArgs) ([]string, []any) {
	first := fires[0].f
	for _, p := range fires {
		keys = append(keys, p.own.Watermark(p.f.Entry))
	}
	for _, p := range fires {
		keys = append(keys, p.own.Handover(p.f.Entry))
	}
	for _, p := range fires {
		keys = append(keys, p.keys.Task(p.id))
	}
	args = append(args, "B", nums.configArg(first), freshArg(first, nums), nums.arg(4, first.MaxStaleness.Milliseconds()))
	for _, p := range fires {
		f := p.f
		args = append(args, nums.arg(2, f.Tick.UnixMilli()), expectedArg(f, nums), p.msg, p.id, f.FiredRecord.ID, f.FiredRecord.Data)
	}
	return keys, args
}

func expectedArg(f *Fire, nums *numArgs) any {
	if f.ExpectNone {
		return ""
	}
	return nums.arg(0, f.Expected.UnixMilli())
}

func freshArg(f *Fire, nums *numArgs) any {
	if f.FreshAsOf.IsZero() {
		return ""
	}
	return nums.arg(1, f.FreshAsOf.UnixMilli())
}

// numArgs remembers the last decimal argument made for each of a few
// numeric fields: in a burst every fire has the same tick, expected
// watermark, config sequence, freshness and staleness bound, and the
// string and its boxing are then made once instead of once per fire.
type numArgs struct {
	set  [5]bool
	val  [5]int64
	args [5]any
	// The last config argument with an id (configArg).
	cfgSeq uint64
	cfgID  string
	cfgArg any
}

// configArg is the config sequence argument: "<seq>", or "<seq>:<id>"
// when the fire knows the id of the config message at seq.
func (n *numArgs) configArg(f *Fire) any {
	if f.ConfigID == "" {
		return n.arg(3, int64(f.ConfigSeq))
	}
	if n.cfgArg == nil || n.cfgSeq != f.ConfigSeq || n.cfgID != f.ConfigID {
		n.cfgSeq, n.cfgID, n.cfgArg = f.ConfigSeq, f.ConfigID, strconv.FormatUint(f.ConfigSeq, 10)+":"+f.ConfigID
	}
	return n.cfgArg
}

func (n *numArgs) arg(i int, v int64) any {
	if !n.set[i] || n.val[i] != v {
		n.set[i], n.val[i], n.args[i] = true, v, strconv.FormatInt(v, 10)
	}
	return n.args[i]
}

// lean reports whether p takes the fire script's short path: a plain tick
// that enqueues a pending task with nothing else to check or record.
func (p preparedFire) lean() bool {
	f := p.f
	return f.Kind == FireTick && !f.OverlapSkip && f.UniqueTTL <= 0 && p.group == "" &&
		f.ProcessAt.IsZero() && len(f.SkippedRecords) == 0
}

// fireCall is one script call: a chunk of fires into one queue.
type fireCall struct {
	prefix  string
	queue   string
	indexes []int // positions in the caller's slice
	fires   []*preparedFire
	// args is the whole command: EVALSHA, the script's hash, the number of
	// keys, the keys, the arguments (built once, at its final size).
	args []any
	cmd  *redis.Cmd
}

// chunkFires groups fires by (prefix, queue) in first-seen order, keeping the
// caller's order inside each group, and cuts each group into calls of up to
// perCall fires.
//
// The calls' commands are laid out in *arena (grown as needed), which must
// outlive the calls; fireBatch reuses it from flight to flight.
func chunkFires(prepared []preparedFire, offset, perCall int, path firePath, arena *[]any) []*fireCall {
	type slot struct{ prefix, queue string }
	open := make(map[slot]*fireCall)
	var calls []*fireCall
	for i := range prepared {
		p := &prepared[i]
		key := slot{p.f.Prefix, p.f.Queue}
		if key.prefix == "" {
			key.prefix = DefaultPrefix
		}
		call := open[key]
		if call == nil || len(call.indexes) >= perCall {
			n := min(perCall, len(prepared)-i)
			call = &fireCall{prefix: key.prefix, queue: p.f.Queue, indexes: make([]int, 0, n), fires: make([]*preparedFire, 0, n)}
			open[key] = call
			calls = append(calls, call)
		}
		call.indexes = append(call.indexes, offset+i)
		call.fires = append(call.fires, p)
	}
	// Keys and arguments interleave per fire, so each call's are gathered
	// in scratch space and then laid out in one slice.
	var keys []string
	var args []any
	var nums numArgs
	cmds := (*arena)[:0]
	ends := make([]int, len(calls))
	for c, call := range calls {
		first := call.fires[0]
		own := first.own
		keys = append(keys[:0], own.Fence(), own.Freshness(), own.Outbox(), first.keys.Pending(), first.keys.Scheduled(), first.keys.Groups(), own.FenceID())
		args = append(args[:0], first.keys.TaskPrefix(), len(call.fires))
		if path == pathAuto && bulkable(call.fires) {
			keys, args = appendBulk(keys, args, call.fires, &nums)
		} else {
			for _, p := range call.fires {
				keys, args = appendFire(keys, args, *p, &nums, path)
			}
		}
		cmds = append(cmds, "evalsha", fireScript.Hash(), len(keys))
		for _, k := range keys {
			cmds = append(cmds, k)
		}
		cmds = append(cmds, args...)
		ends[c] = len(cmds)
	}
	// Sliced once the arena is done growing.
	start := 0
	for c, call := range calls {
		call.args = cmds[start:ends[c]:ends[c]]
		start = ends[c]
	}
	*arena = cmds
	return calls
}

// Scratch reused across fire batches (which may run concurrently): the
// commands of a flight, and a batch's prepared fires. Each is cleared
// before it goes back, so it keeps no message or record alive.
var (
	cmdArenas    = sync.Pool{New: func() any { return new([]any) }}
	preparedBufs = sync.Pool{New: func() any { return new([]preparedFire) }}
)

// runFireCalls sends the queue registrations and every call in one pipeline.
// The registrations are plain commands beside the scripts: asynq:queues (so
// the Inspector and CLI see the queue, as asynq's client does before each
// enqueue) and the tenant's set of queues with an outbox (so the relay finds
// every outbox). Re-adding is cheap inside a pipeline, so nothing is cached.
func runFireCalls(ctx context.Context, c redis.UniversalClient, calls []*fireCall) {
	send := func(calls []*fireCall) {
		pipe := c.Pipeline()
		registered := make(map[[2]string]bool)
		for _, call := range calls {
			if slot := [2]string{call.prefix, call.queue}; !registered[slot] {
				registered[slot] = true
				pipe.SAdd(ctx, AllQueuesKey, call.queue)
				pipe.SAdd(ctx, OutboxesKey(call.prefix), call.queue)
			}
			// As go-redis's EvalSha builds it, so a cluster client routes
			// it by its first key.
			call.cmd = redis.NewCmd(ctx, call.args...)
			call.cmd.SetFirstKeyPos(3)
			_ = pipe.Process(ctx, call.cmd)
		}
		_, _ = pipe.Exec(ctx)
	}
	send(calls)
	var missing []*fireCall
	for _, call := range calls {
		if isNoScript(call.cmd.Err()) {
			// The script cache was empty (a fresh or restarted server):
			// NOSCRIPT means the call did not run, so sending it again
			// with EVAL is safe.
			call.args[0], call.args[1] = "eval", fireScriptSrc
			missing = append(missing, call)
		}
	}
	if len(missing) > 0 {
		send(missing)
	}
}

// FireOnce fires f in one atomic script call. Refusals are statuses, not
// errors; an error means the fire was invalid or Redis failed (the outcome is
// then unknown, and firing the same Fire again is safe).
func (s *Store) FireOnce(ctx context.Context, f Fire) (FireResult, error) {
	res, err := s.fireBatch(ctx, []Fire{f}, maxFiresPerCall)
	if err != nil {
		return FireResult{}, err
	}
	if res[0].Err != nil {
		return res[0], res[0].Err
	}
	return res[0], nil
}

// FireBatch fires many fires, grouped per queue (and per tenant prefix) into
// script calls of up to maxFiresPerCall fires each, sent in pipelines. Fires
// of one queue run in the order given, so a later fire sees the watermark an
// earlier one moved. The results are in the order of fires. A fire whose call
// failed has Err set; FireBatch then also returns an error. An invalid fire
// fails the whole batch before anything is sent.
//
// FireBatch does not look at the outbox backlog: the scheduler pauses firing
// on OutboxLen.
func (s *Store) FireBatch(ctx context.Context, fires []Fire) ([]FireResult, error) {
	return s.fireBatch(ctx, fires, maxFiresPerCall)
}

// fireBatch is FireBatch with the chunk size as a parameter: 1 sends a
// pipeline of one script call per fire (the benchmark's comparison).
func (s *Store) fireBatch(ctx context.Context, fires []Fire, perCall int) ([]FireResult, error) {
	pbuf := preparedBufs.Get().(*[]preparedFire)
	prepared := slices.Grow((*pbuf)[:0], len(fires))[:len(fires)]
	arena := cmdArenas.Get().(*[]any)
	defer func() {
		clear(prepared)
		*pbuf = prepared[:0]
		preparedBufs.Put(pbuf)
		clear(*arena)
		*arena = (*arena)[:0]
		cmdArenas.Put(arena)
	}()
	for i := range fires {
		if err := s.CheckQueue(fires[i].Queue); err != nil {
			return nil, fmt.Errorf("%w: entry %q: %w", ErrInvalidFire, fires[i].Entry, err)
		}
		p, err := prepare(&fires[i])
		if err != nil {
			return nil, err
		}
		// The fires of a batch mostly share one slot: its key names are
		// made once.
		if i > 0 && fires[i].Prefix == fires[i-1].Prefix && fires[i].Queue == fires[i-1].Queue {
			p.own = prepared[i-1].own
		} else {
			p.own = Own(fires[i].Prefix, fires[i].Queue)
		}
		prepared[i] = p
	}
	results := make([]FireResult, len(fires))
	var failed int
	var firstErr error
	for start := 0; start < len(prepared); start += maxFiresPerFlight {
		end := min(start+maxFiresPerFlight, len(prepared))
		calls := chunkFires(prepared[start:end], start, perCall, s.firePath, arena)
		runFireCalls(ctx, s.client, calls)
		for _, call := range calls {
			decodeFireCall(call, results)
		}
		clear(*arena)
		for i := start; i < end; i++ {
			if results[i].Err != nil {
				failed++
				if firstErr == nil {
					firstErr = results[i].Err
				}
			}
		}
	}
	if firstErr != nil {
		return results, fmt.Errorf("fire batch: %d of %d fires failed: %w", failed, len(fires), firstErr)
	}
	return results, nil
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// decodeFireCall stores call's per-fire outcomes in results.
func decodeFireCall(call *fireCall, results []FireResult) {
	fail := func(err error) {
		for _, i := range call.indexes {
			results[i] = FireResult{Err: fmt.Errorf("fire into queue %q: %w", call.queue, err)}
		}
	}
	raw, err := call.cmd.Slice()
	if err != nil {
		fail(err)
		return
	}
	if len(raw) != len(call.indexes) {
		fail(fmt.Errorf("fire script returned %d results for %d fires", len(raw), len(call.indexes)))
		return
	}
	for n, i := range call.indexes {
		if code, ok := raw[n].(int64); ok && code == codeFired {
			// The short path's "fired, pending": the rest is what was sent.
			p := call.fires[n]
			results[i] = FireResult{Status: StatusFired, TaskID: p.id, State: "pending",
				Watermark: time.UnixMilli(p.f.Tick.UnixMilli()).UTC(), WatermarkTaskID: p.id, HasWatermark: true}
			continue
		}
		r, err := parseFireReply(raw[n])
		if err != nil {
			r = FireResult{Err: fmt.Errorf("fire into queue %q: %w", call.queue, err)}
		}
		results[i] = r
	}
}

func parseFireReply(v any) (FireResult, error) {
	row, ok := v.([]any)
	if !ok || len(row) != 6 {
		return FireResult{}, fmt.Errorf("unexpected fire script reply %v", v)
	}
	code, ok := row[0].(int64)
	if !ok {
		return FireResult{}, fmt.Errorf("unexpected fire script code %v", row[0])
	}
	str := func(i int) string { s, _ := row[i].(string); return s }
	var r FireResult
	if wm := str(1); wm != "" {
		ms, err := strconv.ParseInt(wm, 10, 64)
		if err != nil {
			return FireResult{}, fmt.Errorf("stored watermark %q: %w", wm, err)
		}
		r.Watermark, r.WatermarkTaskID, r.HasWatermark = time.UnixMilli(ms).UTC(), str(2), true
	}
	r.TaskID, r.State = str(4), str(5)
	extra := str(3)
	switch code {
	case codeSkipped:
		r.Status = StatusSkippedMissed
	case codeFired:
		r.Status = StatusFired
	case codeExists:
		r.Status = StatusAlreadyExists
	case codeDuplicate:
		r.Status = StatusDuplicate
	case codeOverlap:
		r.Status = StatusSkippedOverlap
	case codeMismatch:
		r.Status = StatusWatermarkMismatch
	case codeMoved:
		r.Status = StatusMoved
		r.MovedAt, _ = strconv.ParseUint(extra, 10, 64)
	case codeFenced:
		r.Status = StatusRevisionFenced
		seq, id, _ := strings.Cut(extra, ":")
		r.Fence, _ = strconv.ParseUint(seq, 10, 64)
		r.FenceID = id
	case codeStale:
		r.Status = StatusStale
		if ms, err := strconv.ParseInt(extra, 10, 64); err == nil {
			r.FreshestAsOf = time.UnixMilli(ms).UTC()
		}
	default:
		return FireResult{}, fmt.Errorf("unknown fire script code %d", code)
	}
	return r, nil
}

// Watermark returns entry's watermark in queue's slot: its last fired or
// skipped tick and the task id stored with it. ok is false when the entry
// never fired there.
func (s *Store) Watermark(ctx context.Context, prefix, queue, entry string) (tick time.Time, taskID string, ok bool, err error) {
	v, err := s.client.Get(ctx, Own(prefix, queue).Watermark(entry)).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, "", false, nil
	}
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("read watermark of entry %q in queue %q: %w", entry, queue, err)
	}
	tick, taskID, err = parseWatermark(v)
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("read watermark of entry %q in queue %q: %w", entry, queue, err)
	}
	return tick, taskID, true, nil
}

// parseWatermark reads the stored form "<tick unix ms> <task id>".
func parseWatermark(v string) (time.Time, string, error) {
	msPart, taskID, _ := strings.Cut(v, " ")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("malformed watermark %q", v)
	}
	return time.UnixMilli(ms).UTC(), taskID, nil
}

// Queue change = handover (docs/design.md INV-handover). The watermark lives in the queue's
// slot, so when an entry moves from queue A to queue B at config revision R:
//
//  1. CloseForHandover(A, R) writes the marker "R out" in A's slot: fires into
//     A refuse from then on (StatusMoved, with A's last watermark), so a
//     replica still on the old configuration cannot fire a tick there.
//  2. SeedWatermark(B, A's watermark, R) writes "R in" in B's slot and raises
//     B's watermark to A's when B's is absent or older.
//
// The marker ("<revision> <in|out>" in the Handover key) only ever moves to a
// higher revision, so both steps are idempotent, a crash between them is
// harmless (repeat both), and a late, repeated step of an older handover
// changes nothing: after A→B at R1 and B→A at R2, A holds "R2 in", and a
// stale CloseForHandover(A, R1) or SeedWatermark(B, …, R1) is ignored.
//
// Both steps also raise the slot's revision fence to R: whoever hands over has
// seen revision R, so a replica whose projection is older than R must not
// fire into either slot. Without this, after A→B→A a replica still on a
// configuration from before the first move (queue A) could fire into A again.

// ErrHandoverSuperseded reports a SeedWatermark for a revision that a later
// (or the same) handover already moved the entry away from.
var ErrHandoverSuperseded = errors.New("handover superseded by a later revision")

// raiseFenceLua raises the revision fence in KEYS[3] to ARGV[1].
const raiseFenceLua = `
local fence = redis.call('GET', KEYS[3])
if not fence or tonumber(fence) < tonumber(ARGV[1]) then redis.call('SET', KEYS[3], ARGV[1]) end
`

// markerIDLua stores "<revision>:<id>" in KEYS[4] when the marker in
// KEYS[1] is now `marker` at revision ARGV[1] and the caller knows the id of
// the config message there (ARGV[idarg], "" = unknown): the marker keeps
// its earlier builds' format, the id sits beside it (OwnKeys.HandoverID).
const markerIDLua = `
local function store_id(marker, id)
  if id ~= '' and redis.call('GET', KEYS[1]) == marker then
    redis.call('SET', KEYS[4], ARGV[1] .. ':' .. id)
  end
end
`

// closeForHandoverScript: KEYS 1 marker, 2 watermark, 3 fence, 4 marker id;
// ARGV 1 revision, 2 id of the config message at revision ("" = unknown).
// Returns {watermark or "", marker}.
var closeForHandoverScript = redis.NewScript(raiseFenceLua + markerIDLua + `
local marker = redis.call('GET', KEYS[1])
if not marker or tonumber(string.match(marker, '^(%d+)')) < tonumber(ARGV[1]) then
  marker = ARGV[1] .. ' out'
  redis.call('SET', KEYS[1], marker)
end
store_id(ARGV[1] .. ' out', ARGV[2])
return {redis.call('GET', KEYS[2]) or '', marker}
`)

// seedWatermarkScript: KEYS 1 marker, 2 watermark, 3 fence, 4 marker id;
// ARGV 1 revision, 2 watermark ms ("" = none), 3 its task id, 4 id of the
// config message at revision ("" = unknown). Returns {1 seeded | 0
// superseded, marker}.
var seedWatermarkScript = redis.NewScript(markerIDLua + `
local marker = redis.call('GET', KEYS[1])
if marker then
  local rev = tonumber(string.match(marker, '^(%d+)'))
  local rev_in = tonumber(ARGV[1])
  if rev > rev_in or (rev == rev_in and string.sub(marker, -4) == ' out') then
    return {0, marker}
  end
end
marker = ARGV[1] .. ' in'
redis.call('SET', KEYS[1], marker)
store_id(marker, ARGV[4])
` + raiseFenceLua + `
if ARGV[2] ~= '' then
  local cur = redis.call('GET', KEYS[2])
  if not cur or tonumber(string.match(cur, '^(-?%d+)')) < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[3])
  end
end
return {1, marker}
`)

// CloseForHandover closes entry in oldQueue's slot at config revision: fires
// there refuse with StatusMoved from now on, and the slot's revision fence is
// raised to revision. configID is the id of the config message at revision
// (events.ConfigMessageID, "" = unknown), stored beside the marker
// (HandoverID). It returns the slot's watermark
// (ok false when the entry never fired there), to be passed to SeedWatermark.
// It is idempotent, and a close for a revision older than the slot's marker
// changes nothing.
func (s *Store) CloseForHandover(ctx context.Context, prefix, oldQueue, entry string, revision uint64, configID string) (tick time.Time, taskID string, ok bool, err error) {
	if entry == "" || oldQueue == "" {
		return time.Time{}, "", false, fmt.Errorf("close entry %q in queue %q for handover: %w: empty entry or queue", entry, oldQueue, ErrInvalidFire)
	}
	own := Own(prefix, oldQueue)
	reply, err := closeForHandoverScript.Run(ctx, s.client, []string{own.Handover(entry), own.Watermark(entry), own.Fence(), own.HandoverID(entry)}, revision, configID).Slice()
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("close entry %q in queue %q for handover at revision %d: %w", entry, oldQueue, revision, err)
	}
	wm, _ := reply[0].(string)
	if wm == "" {
		return time.Time{}, "", false, nil
	}
	tick, taskID, err = parseWatermark(wm)
	if err != nil {
		return time.Time{}, "", false, fmt.Errorf("close entry %q in queue %q for handover: %w", entry, oldQueue, err)
	}
	return tick, taskID, true, nil
}

// SeedWatermark opens entry in newQueue's slot at config revision: it records
// the handover, raises the slot's revision fence to revision, and raises the
// slot's watermark to tick (with taskID) when the slot has none or an older
// one. A zero tick seeds nothing but still opens the
// slot (the entry never fired in its old queue). It clears a "moved out"
// marker of an older revision, so an entry moved A→B→A fires in A again. It
// returns ErrHandoverSuperseded when the slot was closed at this or a later
// revision. It is idempotent. configID is the id of the config message at
// revision (events.ConfigMessageID, "" = unknown), stored beside the marker
// (HandoverID).
//
// It also serves to restore a lost watermark from the last fired event in the
// stream (at the entry's revision, so it never overrides a later handover).
func (s *Store) SeedWatermark(ctx context.Context, prefix, newQueue, entry string, tick time.Time, taskID string, revision uint64, configID string) error {
	if entry == "" || newQueue == "" {
		return fmt.Errorf("seed watermark of entry %q in queue %q: %w: empty entry or queue", entry, newQueue, ErrInvalidFire)
	}
	own := Own(prefix, newQueue)
	ms := ""
	if !tick.IsZero() {
		ms = strconv.FormatInt(tick.UnixMilli(), 10)
	}
	reply, err := seedWatermarkScript.Run(ctx, s.client, []string{own.Handover(entry), own.Watermark(entry), own.Fence(), own.HandoverID(entry)}, revision, ms, taskID, configID).Slice()
	if err != nil {
		return fmt.Errorf("seed watermark of entry %q in queue %q at revision %d: %w", entry, newQueue, revision, err)
	}
	if seeded, _ := reply[0].(int64); seeded != 1 {
		marker, _ := reply[1].(string)
		return fmt.Errorf("seed watermark of entry %q in queue %q at revision %d (slot marker %q): %w", entry, newQueue, revision, marker, ErrHandoverSuperseded)
	}
	return nil
}

// Stream epochs (docs/design.md INV-revision-fence). The revision fence and
// the handover markers hold config stream sequences. When the config stream
// is deleted and recreated, or restored from an older snapshot, they may name
// sequences the stream no longer has, or that hold another message (the ids
// stored beside them, FenceID and HandoverID, tell); a replica that finds so
// (scheduler) clears them with ClearFence and ClearHandover. Both compare
// first: they clear only the value the replica checked, so two replicas
// clearing at once do not fight, and a fence another replica raised
// meanwhile (from the new stream) stays.

// clearSeqScript: KEYS 1 fence or marker, 2 (optional) the id stored beside
// it; ARGV 1 sequence. Deletes the key, and the id beside it, when the
// sequence it starts with ("<seq>" or "<seq> <in|out>") is ARGV[1].
// Returns 1 when it deleted, else 0.
var clearSeqScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.match(v, '^(%d+)') == ARGV[1] then
  redis.call('DEL', unpack(KEYS))
  return 1
end
return 0
`)

// ClearFence deletes queue's revision fence if it still holds seq, and
// reports whether it did. The next fire into the slot sets it again.
func (s *Store) ClearFence(ctx context.Context, prefix, queue string, seq uint64) (bool, error) {
	n, err := clearSeqScript.Run(ctx, s.client, []string{Own(prefix, queue).Fence()}, strconv.FormatUint(seq, 10)).Int()
	if err != nil {
		return false, fmt.Errorf("clear revision fence %d of queue %q: %w", seq, queue, err)
	}
	return n == 1, nil
}

// ClearHandover deletes entry's handover marker in queue's slot, with the id
// stored beside it, if it still records revision, and reports whether it
// did: the slot is open again.
func (s *Store) ClearHandover(ctx context.Context, prefix, queue, entry string, revision uint64) (bool, error) {
	own := Own(prefix, queue)
	n, err := clearSeqScript.Run(ctx, s.client, []string{own.Handover(entry), own.HandoverID(entry)}, strconv.FormatUint(revision, 10)).Int()
	if err != nil {
		return false, fmt.Errorf("clear handover marker %d of entry %q in queue %q: %w", revision, entry, queue, err)
	}
	return n == 1, nil
}

// HandoverID returns the id of the config message (events.ConfigMessageID)
// stored beside entry's handover marker in queue's slot for revision, or ""
// when none is known: the marker was written by an earlier build or without
// an id, or the id stored is of another revision.
func (s *Store) HandoverID(ctx context.Context, prefix, queue, entry string, revision uint64) (string, error) {
	v, err := s.client.Get(ctx, Own(prefix, queue).HandoverID(entry)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the config message id of entry %q's handover marker in queue %q: %w", entry, queue, err)
	}
	seq, id, ok := strings.Cut(v, ":")
	if !ok || seq != strconv.FormatUint(revision, 10) {
		return "", nil
	}
	return id, nil
}
