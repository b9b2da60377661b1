package taskstate

import (
	"crypto/md5"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// This file is the one place where Redis key names are built. asynq's names
// follow asynq v0.26.0 internal/base exactly (docs/asynq-compat.md "Keys"); cronstream's
// own keys carry the same {<queue>} hash tag so that a script may touch both
// in one Redis Cluster slot.

// Global asynq keys. They have no hash tag and are only ever written with plain
// commands, never from inside a script.
const (
	// AllQueuesKey is the SET of every queue name known to asynq's Inspector.
	AllQueuesKey = "asynq:queues"
	// AllSchedulersKey is the ZSET of scheduler-entry list keys, scored by expiry secs.
	AllSchedulersKey = "asynq:schedulers"
)

// SchedulerEntriesKey is the LIST holding one encoded SchedulerEntry per
// registered entry of the scheduler with the given id.
func SchedulerEntriesKey(schedulerID string) string {
	return "asynq:schedulers:{" + schedulerID + "}"
}

// SchedulerHistoryKey is the ZSET of encoded SchedulerEnqueueEvents of one
// entry. It deliberately has no hash tag, as in asynq.
func SchedulerHistoryKey(entryID string) string {
	return "asynq:scheduler_history:" + entryID
}

// Task states as stored in the task hash's "state" field. Each one is also the
// suffix of the queue key that holds the task (for the zset states and
// pending), which asynq's Inspector relies on.
const (
	StatePending     = "pending"
	StateActive      = "active"
	StateScheduled   = "scheduled"
	StateRetry       = "retry"
	StateArchived    = "archived"
	StateCompleted   = "completed"
	StateAggregating = "aggregating"
)

// QueueKeys builds the asynq keys of one queue. The zero value is not useful;
// use Keys.
type QueueKeys struct {
	queue  string
	prefix string // "asynq:{<queue>}:"
}

// Keys returns the asynq key builder for queue. The queue name is used
// verbatim and case-sensitively, as asynq does.
func Keys(queue string) QueueKeys {
	return QueueKeys{queue: queue, prefix: "asynq:{" + queue + "}:"}
}

// Queue is the queue name the keys were built for.
func (k QueueKeys) Queue() string { return k.queue }

// Prefix is "asynq:{<queue>}:", the head of every per-queue asynq key.
func (k QueueKeys) Prefix() string { return k.prefix }

// TaskPrefix is "asynq:{<queue>}:t:"; a task key is this plus the task id.
func (k QueueKeys) TaskPrefix() string { return k.prefix + taskInfix }

// Task is the HASH of one task: "asynq:{<queue>}:t:<id>".
func (k QueueKeys) Task(id string) string { return k.prefix + taskInfix + id }

// AppendTask appends Task(id) to dst.
func (k QueueKeys) AppendTask(dst []byte, id string) []byte {
	return append(append(append(dst, k.prefix...), taskInfix...), id...)
}

const taskInfix = "t:"

// Pending is the LIST of pending task ids (LPUSH in, RPOPLPUSH out).
func (k QueueKeys) Pending() string { return k.prefix + "pending" }

// Active is the LIST of ids being processed.
func (k QueueKeys) Active() string { return k.prefix + "active" }

// Lease is the ZSET of active ids scored by lease expiry secs.
func (k QueueKeys) Lease() string { return k.prefix + "lease" }

// Scheduled is the ZSET of scheduled ids scored by process-at secs.
func (k QueueKeys) Scheduled() string { return k.prefix + "scheduled" }

// Retry is the ZSET of ids waiting for a retry, scored by next attempt secs.
func (k QueueKeys) Retry() string { return k.prefix + "retry" }

// Archived is the ZSET of archived ids scored by archive time secs.
func (k QueueKeys) Archived() string { return k.prefix + "archived" }

// Completed is the ZSET of completed ids scored by expiry secs.
func (k QueueKeys) Completed() string { return k.prefix + "completed" }

// Paused is the STRING whose existence pauses the queue.
func (k QueueKeys) Paused() string { return k.prefix + "paused" }

// Groups is the SET of group names that have aggregating tasks.
func (k QueueKeys) Groups() string { return k.prefix + "groups" }

// GroupPrefix is "asynq:{<queue>}:g:".
func (k QueueKeys) GroupPrefix() string { return k.prefix + "g:" }

// Group is the ZSET of ids waiting to be aggregated in group g.
func (k QueueKeys) Group(g string) string { return k.prefix + "g:" + g }

// AggregationSet is the ZSET of one aggregation run of group g.
func (k QueueKeys) AggregationSet(g, setID string) string {
	return k.prefix + "g:" + g + ":" + setID
}

// AggregationSets is the ZSET of aggregation-set keys scored by deadline secs.
func (k QueueKeys) AggregationSets() string { return k.prefix + "aggregation_sets" }

// ProcessedTotal is the STRING counter of all processed tasks.
func (k QueueKeys) ProcessedTotal() string { return k.prefix + "processed" }

// FailedTotal is the STRING counter of all failed tasks.
func (k QueueKeys) FailedTotal() string { return k.prefix + "failed" }

// Processed is the daily processed counter for the UTC date of t.
func (k QueueKeys) Processed(t time.Time) string {
	return k.prefix + "processed:" + t.UTC().Format(time.DateOnly)
}

// Failed is the daily failure counter for the UTC date of t.
func (k QueueKeys) Failed(t time.Time) string {
	return k.prefix + "failed:" + t.UTC().Format(time.DateOnly)
}

// Unique is the unique-lock key for a task type and payload. A nil payload
// gives a key ending in "<type>:" with nothing after it, while an empty
// non-nil payload hashes like any other (docs/asynq-compat.md "Unique locks").
func (k QueueKeys) Unique(taskType string, payload []byte) string {
	if payload == nil {
		return k.prefix + "unique:" + taskType + ":"
	}
	sum := md5.Sum(payload)
	return k.prefix + "unique:" + taskType + ":" + hex.EncodeToString(sum[:])
}

// DefaultPrefix is cronstream's default tenant prefix: the subject
// prefix's default, so keys and subjects of one tenant share it.
const DefaultPrefix = contract.DefaultPrefix

// OwnKeys builds cronstream's own keys in one queue's slot. The layout is
// "cronstream:{<queue>}:<prefix>:<kind>…": the fixed head keeps the hash tag
// first, so the tag is exactly asynq's tag for the queue whatever the tenant
// prefix contains (a '{' in the prefix could otherwise move the tag).
type OwnKeys struct {
	head string // "cronstream:{<queue>}:<prefix>:"
}

// Own returns cronstream's key builder for tenant prefix and queue. An empty
// prefix means DefaultPrefix.
func Own(prefix, queue string) OwnKeys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return OwnKeys{head: "cronstream:{" + queue + "}:" + prefix + ":"}
}

// Watermark is the STRING holding the last fired or skipped tick of entry in
// this queue's slot (the fire script's compare-and-set value).
func (o OwnKeys) Watermark(entry string) string { return o.entryKey(kindWatermark, entry) }

// AppendWatermark appends Watermark(entry) to dst.
func (o OwnKeys) AppendWatermark(dst []byte, entry string) []byte {
	return o.appendEntryKey(dst, kindWatermark, entry)
}

// Handover is the STRING recording entry's last queue handover in this slot,
// "<revision> out" (moved away: fires here refuse) or "<revision> in"
// (moved here). It only ever moves to a higher revision (see
// CloseForHandover and SeedWatermark).
func (o OwnKeys) Handover(entry string) string { return o.entryKey(kindHandover, entry) }

// AppendHandover appends Handover(entry) to dst.
func (o OwnKeys) AppendHandover(dst []byte, entry string) []byte {
	return o.appendEntryKey(dst, kindHandover, entry)
}

// HandoverID is the STRING "<revision>:<id>": the config message id
// (events.ConfigMessageID) at the revision entry's handover marker was last
// written at by a handover that knew it. Like FenceID it is a key of its own
// so that the marker keeps the format earlier builds read; when its revision
// is not the marker's, the marker's message is unknown.
func (o OwnKeys) HandoverID(entry string) string { return o.entryKey(kindHandoverID, entry) }

// Fires is the STRING "<revision> <count>": how many of entry's scheduled
// ticks created a task in this slot since revision, the one where the
// entry's max_fires last changed (Fire.MaxFires). A fire presenting another
// revision counts from zero.
func (o OwnKeys) Fires(entry string) string { return o.entryKey(kindFires, entry) }

// Fence is the STRING holding the highest config sequence applied by any
// replica firing into this slot (the revision fence).
func (o OwnKeys) Fence() string { return o.head + "fence" }

// FenceID is the STRING "<seq>:<id>": the config message id
// (events.ConfigMessageID) at the sequence the fence was last raised to by a
// fire that presented one. It is a key of its own so that the fence keeps
// the format earlier builds read; when its sequence is not the fence's, the
// fence's message is unknown (raised by an earlier build or without an id).
func (o OwnKeys) FenceID() string { return o.head + "fence:id" }

// Held is the HASH of entry's held tick (overlap buffer-one): the tick the
// fire script took instead of firing it while the entry's previous task was
// busy, with what releasing it writes (HeldTick). At most one per entry.
func (o OwnKeys) Held(entry string) string { return o.entryKey(kindHeld, entry) }

// HeldIndex is the SET of this slot's Held keys, so the release check reads
// one key per queue to learn whether it holds any tick.
func (o OwnKeys) HeldIndex() string { return o.head + kindHeld }

// HeldDrops is the STRING counting the held ticks of this slot that were
// dropped rather than fired (ReleaseHeld), for status.
func (o OwnKeys) HeldDrops() string { return o.head + "helddrops" }

// heldEntry is the entry of Held key k, or false when k is not one.
func (o OwnKeys) heldEntry(k string) (string, bool) {
	e, ok := strings.CutPrefix(k, o.entryKey(kindHeld, ""))
	return e, ok && e != ""
}

// Restore is the HASH of this slot's restore proposals: per entry whose
// watermark Redis lost, the highest tick the replicas proposed to seed it
// with and when the proposal settles (ProposeRestore).
func (o OwnKeys) Restore() string { return o.head + "restore" }

// restoreQueue is the queue of k when k is the restore proposals of a slot
// of tenant prefix (Restore), and false for any other key.
func restoreQueue(prefix, k string) (string, bool) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	rest, ok := strings.CutPrefix(k, "cronstream:{")
	if !ok {
		return "", false
	}
	q, ok := strings.CutSuffix(rest, "}:"+prefix+":restore")
	return q, ok && Own(prefix, q).Restore() == k
}

// Trigger is the STRING remembering a manual trigger's request id, so a
// retried trigger does not enqueue twice.
func (o OwnKeys) Trigger(requestID string) string { return o.head + "trigger:" + requestID }

// Outbox is the STREAM of outcome records (fired, skipped, retried, archived,
// reclaimed) waiting to be published to JetStream.
func (o OwnKeys) Outbox() string { return o.head + "outbox" }

// OutboxOwner is the STRING lease naming the one relay that currently
// publishes this slot's outbox.
func (o OwnKeys) OutboxOwner() string { return o.head + "outbox:owner" }

// ShardLease is the STRING lease of this queue's shard index (ownership,
// docs/design.md "Ownership"): "<replica> <acquired ms> <renewed ms> <ttl
// ms>" (Redis TIME), expiring ttl after its last renewal. Every lease of a
// queue is in the queue's slot, so one MGET reads them all.
func (o OwnKeys) ShardLease(index int) string { return o.head + "lease:" + strconv.Itoa(index) }

// NATSHeardKey is the ZSET of when each replica of tenant prefix last heard
// NATS (member replica id, score Redis-corrected unix ms), so a replica cut
// off from NATS but not from Redis can tell whether the others still hear
// it (ownership). A global key, written with plain commands. An empty
// prefix means DefaultPrefix.
func NATSHeardKey(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return "cronstream:natsheard:" + prefix
}

// Kinds of cronstream's per-entry keys: each one's name is
// "cronstream:{<queue>}:<prefix>:<kind>:<entry>" (Watermark, Handover,
// HandoverID, Fires, Held).
const (
	kindWatermark  = "wm"
	kindHandover   = "moved"
	kindHandoverID = "moved:id"
	kindHeld       = "held"
	kindFires      = "fires"
)

// entryKey is the name of entry's key of kind in this slot.
func (o OwnKeys) entryKey(kind, entry string) string { return o.head + kind + ":" + entry }

// appendEntryKey appends entryKey(kind, entry) to dst.
func (o OwnKeys) appendEntryKey(dst []byte, kind, entry string) []byte {
	return append(append(append(append(dst, o.head...), kind...), ':'), entry...)
}

// EntryKeyPattern is the SCAN MATCH pattern of cronstream's keys of tenant
// prefix in every queue slot; ParseEntryKey picks the per-entry ones (one
// pattern, so a sweep walks the keyspace once). An empty prefix means
// DefaultPrefix.
func EntryKeyPattern(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return "cronstream:{*}:" + globEscape(prefix) + ":*"
}

// ParseEntryKey returns the queue and entry of one of cronstream's per-entry
// keys of tenant prefix, and false for any other key. Entry ids that fire
// hold no ':', '{' or '}' (events.ValidateID), so the entry is what follows
// the last separator, and a queue name that contains the separators cannot
// be misread; a key is accepted only if building it again from the parts
// gives the same name.
func ParseEntryKey(prefix, key string) (queue, entry string, ok bool) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, kind := range []string{kindWatermark, kindHandover, kindHandoverID, kindFires, kindHeld} {
		sep := "}:" + prefix + ":" + kind + ":"
		i := strings.LastIndex(key, sep)
		if i < 0 || !strings.HasPrefix(key, "cronstream:{") || i < len("cronstream:{") {
			continue
		}
		queue, entry = key[len("cronstream:{"):i], key[i+len(sep):]
		own := Own(prefix, queue)
		if entry != "" && !strings.ContainsAny(entry, ":{}") && (own.Watermark(entry) == key || own.Handover(entry) == key || own.HandoverID(entry) == key || own.Fires(entry) == key || own.Held(entry) == key) {
			return queue, entry, true
		}
	}
	return "", "", false
}

// globEscape quotes the characters SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
