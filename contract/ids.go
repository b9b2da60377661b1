package contract

// The ids built here are part of the contract, like the subjects in
// subjects.go, which is why this package owns them: users read them (task
// ids in asynq's CLI and UI, event ids in the audit log and the
// Nats-Msg-Id header) and exactly-once depends on their exact bytes. A
// tick's task id is the same on every replica and in every version, so a
// tick can only ever be one asynq task; an event id is derived from the fact
// it records, so the activity stream drops a republished fact. Changing a
// format would let a tick fire twice across an upgrade. Each format has
// one constructor and one parser here; ids_test.go checks that they agree.

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// TaskTickLayout is how a tick is written in its task id (RFC 3339, UTC,
// whole seconds).
const TaskTickLayout = time.RFC3339

// FormatTaskTick is tick as TaskID writes it.
func FormatTaskTick(tick time.Time) string { return tick.UTC().Format(TaskTickLayout) }

// TaskID is the asynq task id of an entry's scheduled tick,
// <prefix>:<entry>:<tick>: readable in asynq's UI and the same on every
// replica. A backfilled tick has the same id as the scheduled one, so a
// tick fires once whichever way it comes.
func TaskID(prefix, entry string, tick time.Time) string {
	return TaskIDOfTickText(prefix, entry, FormatTaskTick(tick))
}

// TaskIDOfTickText is TaskID with the tick already formatted by
// FormatTaskTick (the fires of one instant share that text).
func TaskIDOfTickText(prefix, entry, tickText string) string {
	return prefix + ":" + entry + ":" + tickText
}

// TriggerTaskID is the asynq task id of a manual trigger,
// <prefix>:<entry>:trigger:<request id>: the request id makes the trigger
// idempotent.
func TriggerTaskID(prefix, entry, requestID string) string {
	return TaskIDPrefix(prefix, entry) + triggerToken + requestID
}

// TaskIDPrefix is what every task id of entry starts with, scheduled,
// backfilled or triggered.
func TaskIDPrefix(prefix, entry string) string { return prefix + ":" + entry + ":" }

const triggerToken = "trigger:"

// TaskIDFields are the parts of a task id cronstream built.
type TaskIDFields struct {
	Prefix string
	Entry  string
	// Tick is the scheduled (or backfilled) tick; zero for a trigger.
	Tick time.Time
	// RequestID is a trigger's request id; empty for a tick.
	RequestID string
}

// ParseTaskID reads a task id built by TaskID or TriggerTaskID. ok is
// false for any other id, including one whose prefix, entry or request id
// those constructors would not be given (NewNames and ValidateID refuse
// them), so a parsed id always names what it was built from.
func ParseTaskID(id string) (f TaskIDFields, ok bool) {
	prefix, rest, found := strings.Cut(id, ":")
	if !found || !isPrefix(prefix) {
		return TaskIDFields{}, false
	}
	entry, rest, found := strings.Cut(rest, ":")
	if !found || ValidateID(entry) != nil {
		return TaskIDFields{}, false
	}
	f.Prefix, f.Entry = prefix, entry
	if req, isTrigger := strings.CutPrefix(rest, triggerToken); isTrigger {
		if ValidateID(req) != nil {
			return TaskIDFields{}, false
		}
		f.RequestID = req
		return f, true
	}
	tick, err := time.Parse(TaskTickLayout, rest)
	if err != nil || FormatTaskTick(tick) != rest {
		return TaskIDFields{}, false // not in the one form TaskID writes
	}
	f.Tick = tick.UTC()
	return f, true
}

// EventKind is the kind of fact an activity event id names.
type EventKind string

// The kinds of activity event ids, by their first token.
const (
	EventIDFired     EventKind = "fire"    // fire:<entry>:<unix tick>
	EventIDTriggered EventKind = "trigger" // trigger:<entry>:<request id>
	// skip:<entry>:<unix tick>, skip:<entry>:<first>-<last>, or
	// skip:<entry>:trigger:<request id> for a trigger's unique duplicate.
	EventIDSkipped   EventKind = "skip"
	EventIDRecovered EventKind = "recover" // recover:<queue token>:<task id>:<retried>:<unix lease expiry>
	EventIDReclaimed EventKind = "reclaim" // reclaim:<queue token>:<set id>
	// cancel:<entry>:<unix tick>, the tick whose fire replaced the task;
	// ParseEventID does not read it (no observer needs its parts).
	EventIDCancelled EventKind = "cancel"
	// lost:<entry>:<first unix tick>-<last unix tick>, or
	// lost:<entry>:unknown-<last unix tick> when which were lost is unknown.
	EventIDLost EventKind = "lost"
)

// FiredEventID is the id of the fired event of an entry's scheduled or
// backfilled tick. Observers read entry and tick off the Nats-Msg-Id
// header without decoding the event (ParseEventID).
func FiredEventID(entry string, tick time.Time) string {
	return "fire:" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
}

// SkippedEventID is the id of the skipped event of one tick.
func SkippedEventID(entry string, tick time.Time) string {
	return "skip:" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
}

// SkippedRangeEventID is the id of one skipped event for the ticks from
// first to last.
func SkippedRangeEventID(entry string, first, last time.Time) string {
	return "skip:" + entry + ":" + strconv.FormatInt(first.Unix(), 10) + "-" + strconv.FormatInt(last.Unix(), 10)
}

// CancelledEventID is the id of the cancelled event of the task that
// entry's tick replaced (overlap cancel-previous): one per tick, as only
// the tick's one fire replaces a task.
func CancelledEventID(entry string, tick time.Time) string {
	return string(EventIDCancelled) + ":" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
}

// LostEventID is the id of the lost event of entry's fires from first to
// last (TasksLost; a zero first: unknown which, up to last). Each replica
// that finds the same loss builds the same id, so the stream keeps one.
func LostEventID(entry string, first, last time.Time) string {
	from := lostUnknown
	if !first.IsZero() {
		from = strconv.FormatInt(first.Unix(), 10)
	}
	return string(EventIDLost) + ":" + entry + ":" + from + "-" + strconv.FormatInt(last.Unix(), 10)
}

const lostUnknown = "unknown"

// TriggerFiredEventID is the id of the fired event of a manual trigger.
func TriggerFiredEventID(entry, requestID string) string {
	return "trigger:" + entry + ":" + requestID
}

// TriggerSkippedEventID is the id of the skipped event of a manual trigger
// whose task asynq's unique lock refused.
func TriggerSkippedEventID(entry, requestID string) string {
	return "skip:" + entry + ":" + triggerToken + requestID
}

// RecoveredEventID is the id of the retried or archived event of a task
// whose lease expired. It names the attempt that was lost (the task, its
// retry count and the lease's expiry), so the same loss has the same id
// however many recoverers decide it. Task ids and queue names are any
// string: see hashedEventID.
func RecoveredEventID(queue, taskID string, retried int, leaseExpiry time.Time) string {
	return hashedEventID("recover:", EncodeQueueToken(queue)+":"+taskID+":"+strconv.Itoa(retried)+":"+strconv.FormatInt(leaseExpiry.Unix(), 10))
}

// ReclaimedEventID is the id of the event of a reclaimed aggregation set.
func ReclaimedEventID(queue, setID string) string {
	return hashedEventID("reclaim:", EncodeQueueToken(queue)+":"+setID)
}

// maxReadableEventID bounds event ids built from names; events readers
// accept ids up to 256 bytes.
const maxReadableEventID = 200

// hashedEventID returns kind + key when that is short and plain printable
// ASCII, else kind + the hex SHA-256 of key. Task ids and queue names are
// any string, and an event id must stay a short, printable header value.
func hashedEventID(kind, key string) string {
	if isPlainKey(kind, key) {
		return kind + key
	}
	sum := sha256.Sum256([]byte(key))
	return kind + hex.EncodeToString(sum[:])
}

func isPlainKey(kind, key string) bool {
	ok := len(kind)+len(key) <= maxReadableEventID
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] > ' ' && key[i] < 0x7f
	}
	return ok
}

// EventIDFields are the parts of an activity event id cronstream built.
type EventIDFields struct {
	Kind EventKind
	// Entry is the entry of a fire, skip or trigger.
	Entry string
	// First and Last are the ticks of a fire or skip (equal but for a
	// skipped range).
	First, Last time.Time
	// RequestID is a trigger's request id.
	RequestID string
	// Queue is the queue of a recovery or reclaim (unless Hashed).
	Queue string
	// TaskID, Retried and LeaseExpiry name a recovered attempt; SetID a
	// reclaimed aggregation set (unless Hashed).
	TaskID      string
	Retried     int
	LeaseExpiry time.Time
	SetID       string
	// Hashed is true for a recovery or reclaim id whose names were too
	// long or not printable: only Kind is known.
	Hashed bool
}

// IsTrigger reports whether f names a trigger's fired or skipped event.
func (f EventIDFields) IsTrigger() bool { return f.RequestID != "" }

// ParseEventID reads an activity event id built by one of the
// constructors above. ok is false for any other id, including one built
// from an entry or request id ValidateID refuses, so a parsed id always
// names what it was built from. Ticks come out in UTC.
func ParseEventID(id string) (f EventIDFields, ok bool) {
	kind, rest, found := strings.Cut(id, ":")
	if !found {
		return EventIDFields{}, false
	}
	switch EventKind(kind) {
	case EventIDFired, EventIDSkipped:
		return parseTickEventID(EventKind(kind), rest)
	case EventIDTriggered:
		entry, req, found := strings.Cut(rest, ":")
		if !found || ValidateID(entry) != nil || ValidateID(req) != nil {
			return EventIDFields{}, false
		}
		return EventIDFields{Kind: EventIDTriggered, Entry: entry, RequestID: req}, true
	case EventIDRecovered:
		return parseRecoveredEventID(rest)
	case EventIDReclaimed:
		return parseReclaimedEventID(rest)
	case EventIDLost:
		return parseLostEventID(rest)
	}
	return EventIDFields{}, false
}

// parseLostEventID reads <entry>:<first>-<last> and <entry>:unknown-<last>
// (First zero).
func parseLostEventID(rest string) (EventIDFields, bool) {
	entry, ts, found := strings.Cut(rest, ":")
	if !found || ValidateID(entry) != nil {
		return EventIDFields{}, false
	}
	f := EventIDFields{Kind: EventIDLost, Entry: entry}
	if last, ok := strings.CutPrefix(ts, lostUnknown+"-"); ok {
		sec, ok := parseUnix(last)
		if !ok {
			return EventIDFields{}, false
		}
		f.Last = time.Unix(sec, 0).UTC()
		return f, true
	}
	r, ok := parseTickEventID(EventIDSkipped, entry+":"+ts)
	if !ok || r.RequestID != "" || !strings.Contains(ts[1:], "-") {
		return EventIDFields{}, false // a range is always written
	}
	f.First, f.Last = r.First, r.Last
	return f, true
}

// parseTickEventID reads <entry>:<tick>, <entry>:<first>-<last> (skips
// only) and <entry>:trigger:<request id> (skips only).
func parseTickEventID(kind EventKind, rest string) (EventIDFields, bool) {
	entry, ts, found := strings.Cut(rest, ":")
	if !found || ValidateID(entry) != nil {
		return EventIDFields{}, false
	}
	f := EventIDFields{Kind: kind, Entry: entry}
	if req, isTrigger := strings.CutPrefix(ts, triggerToken); isTrigger {
		if kind != EventIDSkipped || ValidateID(req) != nil {
			return EventIDFields{}, false
		}
		f.RequestID = req
		return f, true
	}
	if sec, ok := parseUnix(ts); ok {
		f.First = time.Unix(sec, 0).UTC()
		f.Last = f.First
		return f, true
	}
	if kind != EventIDSkipped || len(ts) < 3 {
		return EventIDFields{}, false
	}
	// The separator is the first '-' after the first tick's own sign.
	i := strings.IndexByte(ts[1:], '-') + 1
	if i <= 0 {
		return EventIDFields{}, false
	}
	first, ok1 := parseUnix(ts[:i])
	last, ok2 := parseUnix(ts[i+1:])
	if !ok1 || !ok2 {
		return EventIDFields{}, false
	}
	f.First, f.Last = time.Unix(first, 0).UTC(), time.Unix(last, 0).UTC()
	return f, true
}

// parseUnix accepts only what strconv.FormatInt writes (no sign but a
// minus, no leading zeros, no "-0"), so each tick has one id. It does not
// allocate: observers parse the id of every record relayed.
func parseUnix(s string) (int64, bool) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || digits[0] == '0' && (len(digits) > 1 || len(s) > 1) {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func parseRecoveredEventID(rest string) (EventIDFields, bool) {
	if f, ok := parseHashed(EventIDRecovered, rest); ok {
		return f, true
	}
	tok, rest, found := strings.Cut(rest, ":")
	if !found {
		return EventIDFields{}, false
	}
	queue, err := DecodeQueueToken(tok)
	if err != nil {
		return EventIDFields{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return EventIDFields{}, false
	}
	rest, expiry := rest[:i], rest[i+1:]
	j := strings.LastIndexByte(rest, ':')
	if j < 0 {
		return EventIDFields{}, false
	}
	taskID, retriedText := rest[:j], rest[j+1:]
	retried, err := strconv.Atoi(retriedText)
	sec, ok := parseUnix(expiry)
	if err != nil || strconv.Itoa(retried) != retriedText || !ok {
		return EventIDFields{}, false
	}
	f := EventIDFields{Kind: EventIDRecovered, Queue: queue, TaskID: taskID, Retried: retried, LeaseExpiry: time.Unix(sec, 0).UTC()}
	if RecoveredEventID(queue, taskID, retried, f.LeaseExpiry) != "recover:"+tok+":"+rest+":"+expiry {
		return EventIDFields{}, false // would have been hashed
	}
	return f, true
}

func parseReclaimedEventID(rest string) (EventIDFields, bool) {
	if f, ok := parseHashed(EventIDReclaimed, rest); ok {
		return f, true
	}
	tok, setID, found := strings.Cut(rest, ":")
	if !found {
		return EventIDFields{}, false
	}
	queue, err := DecodeQueueToken(tok)
	if err != nil || !isPlainKey("reclaim:", rest) {
		return EventIDFields{}, false
	}
	return EventIDFields{Kind: EventIDReclaimed, Queue: queue, SetID: setID}, true
}

// parseHashed recognises the hashed form: 64 lower-case hex digits and no
// ':' (a readable key always has one).
func parseHashed(kind EventKind, rest string) (EventIDFields, bool) {
	if len(rest) != 2*sha256.Size {
		return EventIDFields{}, false
	}
	for i := 0; i < len(rest); i++ {
		if unhex(rest[i]) < 0 {
			return EventIDFields{}, false
		}
	}
	return EventIDFields{Kind: kind, Hashed: true}, true
}

// isPrefix is prefixPattern without the regexp, for parsers on hot paths.
func isPrefix(p string) bool {
	ok := len(p) >= 1 && len(p) <= 64
	for i := 0; ok && i < len(p); i++ {
		ok = isTokenByte(p[i])
	}
	return ok
}
