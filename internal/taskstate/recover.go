package taskstate

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/redisscript"
)

// The recovery side of asynq's task life cycle (docs/asynq-compat.md "Leases"
// to "Aggregation sets"), made batch-wise, re-checked and audited:
//
//   - ListLeaseExpired reads lease-expired tasks in bounded pages; a task that
//     cannot be decoded is reported, never fatal.
//   - RecoverBatch applies the caller's retry/archive decisions, each one
//     re-checked inside the script (lease still expired, message unchanged)
//     and written together with its outbox record.
//   - RecoverOrphans gives a lease to active tasks that lost theirs and drops
//     stray ids from the active list.
//   - ReclaimStaleAggregationSets returns stale aggregation sets to their
//     group, re-registers the group and records the reclaim.
//
// Removing ids from the active list is the expensive part of recovery:
// asynq's LREM with count 0 scans the whole list for every task, which is why
// asynq falls to ~1,000 tasks/s at 100k active tasks. A caller instead lists
// the expired ids (ListLeaseRefs), orders them by where they sit in the
// active list, nearest the tail first (SortTailFirst), and hands them to
// RecoverBatch in batches cut in that order. RecoverBatch learns where its
// tasks sit (one read of the list from the tail, in LRANGE pages, until all
// are found) and sends them in chunks, oldest first. A chunk whose tasks
// fill a short stretch of the tail is taken out through a window: the
// script reads the stretch, takes it off the tail with one LTRIM and puts
// back the elements that are not its tasks (live tasks) at the head with
// one LPUSH. Put back at the tail, they would pile up there and every later
// window would copy them again; asynq reads nothing from the list's order.
// Positions counted from the tail do not change when workers push new tasks
// at the head, and a task that is not where its chunk expects it (another
// client removed something meanwhile) is overwritten with a per-call
// tombstone where LINDEX or LPOS finds it, all such removed with one LREM.
//
// Why this design: finding one id with LREM or LPOS scans the list, so its
// cost grows with the list (asynq's cost per task); LSET and LREM in the
// middle of the list shift the bytes of a list node per element; loading
// the whole list into Lua to rebuild it in one script breaks the 10 ms
// budget of a script call at large lists, while reading it from Go in
// LRANGE pages blocks nothing for long (figures in docs/benchmarks.md).

// LeaseExpired is one task whose lease expired at or before the scan's cutoff.
type LeaseExpired struct {
	// Msg is the decoded task message.
	Msg *TaskMessage
	// LeaseExpiry is the task's score in the lease set (whole seconds).
	LeaseExpiry time.Time
	// MsgHash is the lowercase hex SHA-1 of the stored msg bytes, as Redis'
	// redis.sha1hex computes it; RecoverBatch re-checks it.
	MsgHash string
}

// BadTask is a lease-expired id that cannot be recovered as it is: its
// message is missing (ErrNoMessage), undecodable (ErrMalformed) or belongs to
// another id or queue (ErrMismatch). It is reported and left untouched.
type BadTask struct {
	ID  string
	Err error
}

var (
	// ErrNoMessage reports a task id whose hash has no msg field.
	ErrNoMessage = errors.New("task has no message")
	// ErrMismatch reports a message whose id or queue differs from the key
	// it is stored under; asynq workers would act on the wrong keys.
	ErrMismatch = errors.New("task message does not match its key")
	// ErrInvalidDecision reports a Decision RecoverBatch cannot apply.
	ErrInvalidDecision = errors.New("invalid recovery decision")
)

// ErrLeaseExpiredText is the error text asynq's recoverer records for a task
// whose lease expired (asynq's ErrLeaseExpired).
const ErrLeaseExpiredText = "asynq: task lease expired"

// Action is what a Decision does with a task.
type Action uint8

const (
	// ActionRetry moves the task to the retry set (asynq's Retry).
	ActionRetry Action = iota + 1
	// ActionArchive moves the task to the archive (asynq's Archive).
	ActionArchive
)

func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionArchive:
		return "archive"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Decision is the caller's verdict on one LeaseExpired task. Build it with
// LeaseExpired.Retry or LeaseExpired.Archive and set Record.
type Decision struct {
	TaskID string
	// MsgHash is LeaseExpired.MsgHash: the move only happens while the
	// stored message is still the one the decision was made on.
	MsgHash string
	Action  Action
	// RetryAt is when the task becomes due again (ActionRetry only).
	RetryAt time.Time
	// IsFailure counts the retry as a failure (processed and failed
	// counters); archives always count.
	IsFailure bool
	// NewMsg is the re-encoded message to store (retried, error_msg and
	// last_failed_at updated as asynq does).
	NewMsg []byte
	// Record is the outbox record written with the move (event id + data).
	Record Record
}

// Retry builds asynq's Retry decision for le: retried+1 only when
// isFailure, error_msg = errMsg, last_failed_at = now, due at retryAt.
func (le LeaseExpired) Retry(retryAt time.Time, errMsg string, isFailure bool, now time.Time) (Decision, error) {
	m := *le.Msg
	if isFailure {
		m.Retried++
	}
	m.ErrorMsg = errMsg
	m.LastFailedAt = now.Unix()
	b, err := EncodeTaskMessage(&m)
	if err != nil {
		return Decision{}, fmt.Errorf("retry task %q: %w", le.Msg.ID, err)
	}
	return Decision{TaskID: le.Msg.ID, MsgHash: le.MsgHash, Action: ActionRetry, RetryAt: retryAt,
		IsFailure: isFailure, NewMsg: b}, nil
}

// Archive builds asynq's Archive decision for le: error_msg = errMsg,
// last_failed_at = now, retried unchanged.
func (le LeaseExpired) Archive(errMsg string, now time.Time) (Decision, error) {
	m := *le.Msg
	m.ErrorMsg = errMsg
	m.LastFailedAt = now.Unix()
	b, err := EncodeTaskMessage(&m)
	if err != nil {
		return Decision{}, fmt.Errorf("archive task %q: %w", le.Msg.ID, err)
	}
	return Decision{TaskID: le.Msg.ID, MsgHash: le.MsgHash, Action: ActionArchive, NewMsg: b}, nil
}

// RecoverStatus is what RecoverBatch did with one decision.
type RecoverStatus uint8

const (
	// RecoverNotAttempted: the decision's script call did not run (the
	// call failed or the context ended first). The task is untouched.
	RecoverNotAttempted RecoverStatus = iota
	// RecoverRetried: moved to the retry set, record written.
	RecoverRetried
	// RecoverArchived: moved to the archive, record written.
	RecoverArchived
	// RecoverSkippedGone: no longer in the lease set (finished, or recovered
	// by someone else).
	RecoverSkippedGone
	// RecoverSkippedLeaseExtended: its lease now ends after the cutoff.
	RecoverSkippedLeaseExtended
	// RecoverSkippedMessageChanged: its stored message is missing or is not
	// the one the decision was made on.
	RecoverSkippedMessageChanged
	// RecoverSkippedNotActive: its state field is not "active".
	RecoverSkippedNotActive
)

var recoverStatusNames = [...]string{
	RecoverNotAttempted:          "not attempted",
	RecoverRetried:               "retried",
	RecoverArchived:              "archived",
	RecoverSkippedGone:           "skipped: gone",
	RecoverSkippedLeaseExtended:  "skipped: lease extended",
	RecoverSkippedMessageChanged: "skipped: message changed",
	RecoverSkippedNotActive:      "skipped: not active",
}

func (s RecoverStatus) String() string {
	if int(s) < len(recoverStatusNames) {
		return recoverStatusNames[s]
	}
	return "RecoverStatus(" + strconv.Itoa(int(s)) + ")"
}

// Moved reports whether the task was retried or archived.
func (s RecoverStatus) Moved() bool { return s == RecoverRetried || s == RecoverArchived }

// Outcome is the result of one Decision, in the order of the decisions.
type Outcome struct {
	TaskID string
	Status RecoverStatus
	// StreamID is the outbox stream id of the record (moved tasks only).
	StreamID string
	// Searched: the move searched the active list for the task (LPOS, a
	// scan of the list) because the position read before the move was
	// stale (the list changed in between).
	Searched bool
}

// asynq constants (docs/asynq-compat.md "Counters", "Retry and archive", "Leases").
const (
	statsTTL             = 90 * 24 * time.Hour
	archiveMaxAgeDays    = 90
	archiveMaxSize       = 10000
	defaultLeaseDuration = 30 * time.Second
)

// MsgHash returns the lowercase hex SHA-1 of raw msg bytes, the value
// redis.sha1hex computes inside a script.
func MsgHash(msg []byte) string {
	sum := sha1.Sum(msg)
	return hex.EncodeToString(sum[:])
}

// Store-side tuning of RecoverBatch's list positioning.
const (
	// Positions are read when LPOS from the tail would cost more: below
	// positionMinWork decisions × list length, every LPOS of a call
	// together stays around a millisecond (LPOS's scan rate in
	// docs/benchmarks.md).
	positionMinWork = 200_000
	positionMinList = 2048
	// positionPage is how many list elements one LRANGE reads.
	positionPage  = 5000
	positionPages = 4
	// recoverPipeline is how many chunks of a RecoverBatch are sent in one
	// pipeline (each chunk stays one atomic script call).
	recoverPipeline = 8
	// RecoveredBatchBytes bounds the events of one outbox batch record
	// (a recovery event is about 470 bytes with a UUID task id, so a
	// script chunk's 128 fit in one unless names are long). A
	// batch is one message in the activity stream: far below NATS's
	// default max_payload of 1 MB, and a relay whose server allows less
	// publishes its events one by one.
	RecoveredBatchBytes = 64 << 10
	// maxTrimCalls bounds the extra trim-only calls after a batch.
	maxTrimCalls = 1000
	// A chunk spread over at most windowMaxFactor times its size of the
	// list's tail is taken out through a window of that stretch; a longer
	// window would move more of the list than it saves.
	windowMaxFactor = 4
)

// RecoverBatch applies decisions to queue's tasks and writes the events of
// the moved tasks (their Record) to prefix's outbox of queue, atomically
// with the move: each script call's events go in batch records of at most
// RecoveredBatchBytes (outbox.BatchRecordTag, id events.BatchID), an event
// alone in its batch in a record of its own.
// Each decision is re-checked inside the script: the task must still be in
// the lease set with a score at or before cutoff, its stored message must
// still hash to MsgHash, and its state must be "active"; otherwise it is left
// alone and the outcome says why.
//
// Decisions may be many (thousands): they are sent in chunks of at most
// WithRecoverChunk decisions per script call, ordered by their position in
// the active list (oldest first). The outcomes are in the order of
// decisions. On error, outcomes of chunks that did not run are
// RecoverNotAttempted; chunks that ran are reported as they happened.
func (s *Store) RecoverBatch(ctx context.Context, prefix, queue string, cutoff time.Time, decisions []Decision) ([]Outcome, error) {
	if err := s.CheckQueue(queue); err != nil {
		return nil, err
	}
	for i := range decisions {
		if err := checkDecision(&decisions[i]); err != nil {
			return nil, fmt.Errorf("recover queue %q: decision %d: %w", queue, i, err)
		}
	}
	outcomes := make([]Outcome, len(decisions))
	for i := range decisions {
		outcomes[i].TaskID = decisions[i].TaskID
	}
	if len(decisions) == 0 {
		return outcomes, nil
	}
	if err := s.RegisterOutbox(ctx, prefix, queue); err != nil {
		return outcomes, err
	}
	ids := make([]string, len(decisions))
	for i := range decisions {
		ids[i] = decisions[i].TaskID
	}
	depth, err := s.listDepths(ctx, Keys(queue), ids)
	if err != nil {
		return outcomes, fmt.Errorf("recover queue %q: %w", queue, err)
	}
	return outcomes, s.recoverInListOrder(ctx, prefix, queue, cutoff, decisions, depth, outcomes)
}

// recoverInListOrder runs the chunks of RecoverBatch. depth holds the
// decisions' tail depths in the active list (missing = unknown); a wrong
// depth only costs an LPOS, never correctness.
func (s *Store) recoverInListOrder(ctx context.Context, prefix, queue string, cutoff time.Time, decisions []Decision, depth map[string]int, outcomes []Outcome) error {
	run, err := s.newRecoveryRun(prefix, queue, cutoff, decisions, depth, outcomes)
	if err != nil {
		return err
	}
	order := run.tailOrder()
	for start := 0; start < len(order); {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("recover queue %q: %w", queue, err)
		}
		// Up to recoverPipeline chunks go in one pipeline, so Redis runs
		// them back to back. A chunk's depth hints assume every earlier
		// chunk took what it was sent to take off the tail; one that did
		// not only costs the chunks after it an LPOS per task.
		batch := redisscript.NewBatch(s.client)
		var calls []chunkCall
		assumed := run.taken
		for len(calls) < recoverPipeline && start < len(order) {
			chunk := order[start:min(start+s.recoverChunk, len(order))]
			start += len(chunk)
			var args []any
			args, assumed = run.chunkArgs(chunk, assumed)
			calls = append(calls, chunkCall{chunk: chunk, cmd: batch.Run(ctx, recoverScript, run.keys, args...)})
		}
		batch.Exec(ctx)
		if err := run.takeReplies(calls); err != nil {
			return err
		}
	}
	return run.trimArchive(ctx)
}

// recoveryRun is one RecoverBatch's state across its chunks.
type recoveryRun struct {
	s         *Store
	queue     string
	decisions []Decision
	outcomes  []Outcome
	// depths are the decisions' tail depths (0: unknown).
	depths []int
	// keys and head are the script's keys and its leading arguments,
	// shared by every chunk and the archive trims.
	keys []string
	head []any
	// taken counts the list elements earlier chunks took off the tail;
	// trimMore says the archive is still over its bounds.
	taken    int
	trimMore bool
}

// chunkCall is one chunk's script call in a pipeline.
type chunkCall struct {
	chunk []int
	cmd   *redis.Cmd
}

func (s *Store) newRecoveryRun(prefix, queue string, cutoff time.Time, decisions []Decision, depth map[string]int, outcomes []Outcome) (*recoveryRun, error) {
	k := Keys(queue)
	now := s.now()
	tomb, err := tombstone()
	if err != nil {
		return nil, err
	}
	run := &recoveryRun{s: s, queue: queue, decisions: decisions, outcomes: outcomes, depths: make([]int, len(decisions))}
	for i := range decisions {
		run.depths[i] = depth[decisions[i].TaskID]
	}
	run.keys = []string{
		k.Lease(), k.Active(), k.Retry(), k.Archived(), k.Processed(now), k.Failed(now),
		k.ProcessedTotal(), k.FailedTotal(), k.TaskPrefix(), Own(prefix, queue).Outbox(),
	}
	run.head = []any{
		cutoff.Unix(), now.Unix(), now.Add(statsTTL).Unix(), now.AddDate(0, 0, -archiveMaxAgeDays).Unix(),
		archiveMaxSize, s.trimBudget, tomb, int64(math.MaxInt64),
	}
	return run, nil
}

// tailOrder returns the decisions' indexes in tail order: known positions
// ascending, unknown ones last.
func (run *recoveryRun) tailOrder() []int {
	order := make([]int, len(run.decisions))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return compareDepth(run.depths[a], run.depths[b]) })
	return order
}

// chunkArgs returns the script arguments of chunk, given that assumed
// elements were taken off the tail before it, and how many will have been
// taken after it.
func (run *recoveryRun) chunkArgs(chunk []int, assumed int) ([]any, int) {
	hints := make([]int, len(chunk))
	deepest := 0
	for j, i := range chunk {
		if dp := run.depths[i]; dp > 0 && dp-assumed >= 1 {
			hints[j] = dp - assumed
			deepest = max(deepest, hints[j])
		}
	}
	// A chunk whose tasks sit together at the tail goes through a
	// window: every element down to its deepest task leaves the tail
	// (recover.lua).
	window := 0
	if deepest > 0 && deepest <= windowMaxFactor*len(chunk) {
		window = deepest
	}
	// Events are batched when each is a JSON object, as the recoverer's
	// are.
	batchBytes := RecoveredBatchBytes
	for _, i := range chunk {
		if data := run.decisions[i].Record.Data; len(data) == 0 || data[0] != '{' {
			batchBytes = 0
		}
	}
	args := append(make([]any, 0, len(run.head)+3+9*len(chunk)), run.head...)
	args = append(args, window, batchBytes, outbox.BatchRecordTag)
	for j, i := range chunk {
		d := &run.decisions[i]
		action, fail := "r", "0"
		if d.Action == ActionArchive {
			action = "a"
		}
		if d.IsFailure {
			fail = "1"
		}
		args = append(args, d.TaskID, d.MsgHash, action, d.RetryAt.Unix(), fail, d.NewMsg,
			d.Record.ID, d.Record.Data, hints[j])
	}
	if window > 0 {
		return args, assumed + window
	}
	for _, i := range chunk {
		if run.depths[i] > 0 {
			assumed++
		}
	}
	return args, assumed
}

// takeReplies records the outcomes of a pipeline's chunks and what they
// took off the tail, and returns the first chunk's error.
func (run *recoveryRun) takeReplies(calls []chunkCall) error {
	var firstErr error
	for _, c := range calls {
		reply, err := c.cmd.Slice()
		switch {
		case err != nil:
			err = fmt.Errorf("recover queue %q: %d tasks: %w", run.queue, len(c.chunk), err)
		case len(reply) != 3*len(c.chunk)+2:
			err = fmt.Errorf("recover queue %q: reply has %d values for %d tasks", run.queue, len(reply), len(c.chunk))
		}
		if err != nil {
			// The chunks after it ran (or not) on their own; their
			// outcomes are reported all the same.
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		for j, i := range c.chunk {
			st, _ := reply[3*j].(int64)
			xid, _ := reply[3*j+1].(string)
			rm, _ := reply[3*j+2].(int64)
			if (rm == 1 || rm == 3) && run.depths[i] > 0 {
				run.taken++
			}
			run.outcomes[i].Status, run.outcomes[i].StreamID, run.outcomes[i].Searched = RecoverStatus(st), xid, rm >= 3
		}
		w, _ := reply[len(reply)-2].(int64)
		run.taken += int(w)
		if more, _ := reply[len(reply)-1].(int64); more == 1 {
			run.trimMore = true
		}
	}
	return firstErr
}

// trimArchive trims the archive while the chunks said it is over its
// bounds, in at most maxTrimCalls calls.
func (run *recoveryRun) trimArchive(ctx context.Context) error {
	for n := 0; run.trimMore && n < maxTrimCalls; n++ {
		more, err := trimArchiveScript.Run(ctx, run.s.client, run.keys, run.head...).Int64()
		if err != nil {
			return fmt.Errorf("trim archive of queue %q: %w", run.queue, err)
		}
		run.trimMore = more == 1
	}
	return nil
}

func checkDecision(d *Decision) error {
	switch {
	case d.TaskID == "":
		return fmt.Errorf("%w: empty task id", ErrInvalidDecision)
	case len(d.MsgHash) != 40:
		return fmt.Errorf("%w: task %q: message hash %q is not a hex SHA-1", ErrInvalidDecision, d.TaskID, d.MsgHash)
	case d.Action != ActionRetry && d.Action != ActionArchive:
		return fmt.Errorf("%w: task %q: action %v", ErrInvalidDecision, d.TaskID, d.Action)
	case len(d.NewMsg) == 0:
		return fmt.Errorf("%w: task %q: no new message", ErrInvalidDecision, d.TaskID)
	case d.Record.ID == "" || len(d.Record.Data) == 0:
		return fmt.Errorf("%w: task %q: outbox record needs an event id and data", ErrInvalidDecision, d.TaskID)
	}
	return nil
}

// tombstone returns a value that stands for "removed" in the active list
// during one RecoverBatch call. It is random, so it can never equal a task
// id, and each script removes its own tombstones before it returns.
func tombstone() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("tombstone: %w", err)
	}
	return "cronstream:tombstone:" + hex.EncodeToString(b[:]), nil
}

// OrphanReport is what RecoverOrphans found.
type OrphanReport struct {
	// Examined is the number of active-list entries looked at.
	Examined int
	// Leased are ids that were active without a lease entry and got one.
	Leased []string
	// Removed are ids dropped from the active list: their hash is gone,
	// has no message, or its state is not "active".
	Removed []string
}

// RecoverOrphans walks queue's whole active list, limit entries per script
// call (0 = 1000), and repairs what asynq leaves stuck (asynq issues 1144,
// 1051): an id with no lease entry whose hash says state "active" gets a
// lease at now + leaseDuration (0 = asynq's 30 s; never in the past), so a
// worker still holding it extends it with its next heartbeat and only a dead
// worker's task is recovered later; an id whose hash is missing, has no
// message or is not active is removed from the active list. All checks run
// inside the script.
func (s *Store) RecoverOrphans(ctx context.Context, queue string, now time.Time, leaseDuration time.Duration, limit int) (OrphanReport, error) {
	var rep OrphanReport
	if err := s.CheckQueue(queue); err != nil {
		return rep, err
	}
	if leaseDuration <= 0 {
		leaseDuration = defaultLeaseDuration
	}
	if limit <= 0 {
		limit = 1000
	}
	// Round up to whole seconds so that the lease never ends before
	// now + leaseDuration.
	expiry := now.Add(leaseDuration + time.Second - 1).Unix()
	tomb, err := tombstone()
	if err != nil {
		return rep, err
	}
	k := Keys(queue)
	keys := []string{k.Active(), k.Lease(), k.TaskPrefix()}
	for off := 0; ; {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("recover orphans of queue %q: %w", queue, err)
		}
		reply, err := runScript(ctx, s.client, recoverOrphansScript, keys, off, limit, expiry, tomb)
		if err != nil {
			return rep, fmt.Errorf("recover orphans of queue %q: %w", queue, err)
		}
		if len(reply) != 3 {
			return rep, fmt.Errorf("recover orphans of queue %q: reply has %d values", queue, len(reply))
		}
		n, _ := reply[0].(int64)
		leased, removed := stringSlice(reply[1]), stringSlice(reply[2])
		rep.Examined += int(n)
		rep.Leased = append(rep.Leased, leased...)
		rep.Removed = append(rep.Removed, removed...)
		if int(n) < limit {
			return rep, nil
		}
		// Removed elements were nearer the tail than the next page.
		off += int(n) - len(removed)
	}
}

func stringSlice(v any) []string {
	arr, _ := v.([]any)
	out := make([]string, 0, len(arr))
	for _, x := range arr {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
