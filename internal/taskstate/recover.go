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

// LeaseRef is one entry of a queue's lease set: a task id and the end of
// its lease.
type LeaseRef struct {
	ID string
	// LeaseExpiry is the entry's score (whole seconds).
	LeaseExpiry time.Time
}

// ListLeaseExpired returns up to limit tasks of queue whose lease score is at
// or before cutoff, lowest score first, with the ids that cannot be
// recovered reported in the second slice. It is ListLeaseExpiredFrom with
// offset 0.
func (s *Store) ListLeaseExpired(ctx context.Context, queue string, cutoff time.Time, limit int) ([]LeaseExpired, []BadTask, error) {
	return s.ListLeaseExpiredFrom(ctx, queue, cutoff, 0, limit)
}

// ListLeaseExpiredFrom is ListLeaseExpired starting at the offset-th entry of
// the lease range: ListLeaseRefs, then LoadLeaseExpired. Bad tasks stay in
// the lease set, so a caller that pages through a pass skips them with
// offset += len(bad) (plus the decisions that RecoverBatch left in place).
func (s *Store) ListLeaseExpiredFrom(ctx context.Context, queue string, cutoff time.Time, offset, limit int) ([]LeaseExpired, []BadTask, error) {
	refs, err := s.ListLeaseRefs(ctx, queue, cutoff, offset, limit)
	if err != nil {
		return nil, nil, err
	}
	return s.LoadLeaseExpired(ctx, queue, refs)
}

// Listing tuning: a page of ids is one ZRANGE, and the pages of one
// listing go leaseRefPipeline at a time in one pipeline; a page of
// messages is one script call of listPage ids.
const (
	leaseRefPage      = 2000
	leaseRefPipeline  = 25
	leaseMsgsPipeline = 4
)

// ListLeaseRefs returns up to limit entries of queue's lease set with a
// score at or before cutoff, lowest score first, starting at the offset-th
// of them. ZCOUNT says how many there are, and the listing reads exactly
// those ranks: the expired entries are the lowest ranks, and ZRANGE by rank
// finds an offset in O(log n), where ZRANGEBYSCORE … LIMIT walks to it.
// Pages may overlap or miss entries that others remove meanwhile;
// RecoverBatch re-checks every task and the next pass lists what was
// missed.
func (s *Store) ListLeaseRefs(ctx context.Context, queue string, cutoff time.Time, offset, limit int) ([]LeaseRef, error) {
	if err := s.CheckQueue(queue); err != nil {
		return nil, err
	}
	k := Keys(queue)
	expired, err := s.client.ZCount(ctx, k.Lease(), "-inf", strconv.FormatInt(cutoff.Unix(), 10)).Result()
	if err != nil {
		return nil, fmt.Errorf("count lease-expired tasks of queue %q: %w", queue, err)
	}
	return s.listLeaseRefs(ctx, k, cutoff, offset, min(int(expired)-offset, limit))
}

// listLeaseRefs reads n lease entries from rank offset on, keeping those at
// or before cutoff.
func (s *Store) listLeaseRefs(ctx context.Context, k QueueKeys, cutoff time.Time, offset, n int) ([]LeaseRef, error) {
	if n <= 0 {
		return nil, nil
	}
	last := float64(cutoff.Unix())
	refs := make([]LeaseRef, 0, n)
	seen := make(map[string]struct{}, n)
	for end := offset + n; offset < end; {
		pipe := s.client.Pipeline()
		var cmds []*redis.ZSliceCmd
		for p := 0; p < leaseRefPipeline && offset < end; p++ {
			m := min(leaseRefPage, end-offset)
			cmds = append(cmds, pipe.ZRangeWithScores(ctx, k.Lease(), int64(offset), int64(offset+m-1)))
			offset += m
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return refs, fmt.Errorf("list lease-expired tasks of queue %q: %w", k.Queue(), err)
		}
		for _, c := range cmds {
			page := c.Val()
			for _, z := range page {
				if z.Score > last {
					return refs, nil
				}
				id, _ := z.Member.(string)
				if _, dup := seen[id]; dup {
					continue
				}
				seen[id] = struct{}{}
				refs = append(refs, LeaseRef{ID: id, LeaseExpiry: time.Unix(int64(z.Score), 0)})
			}
			if len(page) < leaseRefPage && offset < end {
				return refs, nil // the set is shorter than counted: others removed entries
			}
		}
	}
	return refs, nil
}

// ListTailFirst is ListLeaseRefs in the order SortTailFirst gives. In a
// mass crash (expired entries at least half as many as the active list
// holds, so their tasks are spread over all of it) it reads the whole list
// while it lists, instead of after.
func (s *Store) ListTailFirst(ctx context.Context, queue string, cutoff time.Time, offset, limit int) ([]LeaseRef, error) {
	if err := s.CheckQueue(queue); err != nil {
		return nil, err
	}
	k := Keys(queue)
	pipe := s.client.Pipeline()
	count := pipe.ZCount(ctx, k.Lease(), "-inf", strconv.FormatInt(cutoff.Unix(), 10))
	llen := pipe.LLen(ctx, k.Active())
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("count lease-expired tasks of queue %q: %w", queue, err)
	}
	n, listed := min(int(count.Val())-offset, limit), int(llen.Val())
	if listed < positionMinList || 2*n < listed {
		refs, err := s.listLeaseRefs(ctx, k, cutoff, offset, n)
		if err != nil {
			return nil, err
		}
		return refs, s.SortTailFirst(ctx, queue, refs)
	}
	var (
		depth    map[string]int
		depthErr error
		read     = make(chan struct{})
	)
	go func() {
		defer close(read)
		depth, depthErr = s.readDepths(ctx, k, listed, nil)
	}()
	refs, err := s.listLeaseRefs(ctx, k, cutoff, offset, n)
	<-read
	if err != nil {
		return nil, err
	}
	if depthErr != nil {
		return nil, fmt.Errorf("order lease-expired tasks of queue %q: %w", queue, depthErr)
	}
	sortByDepth(refs, depth)
	return refs, nil
}

// LoadLeaseExpired reads the messages of refs (listed by ListLeaseRefs) and
// returns the tasks in refs' order, with the ids that cannot be recovered
// as they are in the second slice. An id that left the lease set since it
// was listed (finished, or recovered by someone else) is in neither.
func (s *Store) LoadLeaseExpired(ctx context.Context, queue string, refs []LeaseRef) ([]LeaseExpired, []BadTask, error) {
	if err := s.CheckQueue(queue); err != nil {
		return nil, nil, err
	}
	k := Keys(queue)
	keys := []string{k.Lease(), k.TaskPrefix()}
	tasks := make([]LeaseExpired, 0, len(refs))
	var bad []BadTask
	for len(refs) > 0 {
		batch := redisscript.NewBatch(s.client)
		var (
			cmds  []*redis.Cmd
			pages [][]LeaseRef
		)
		for len(cmds) < leaseMsgsPipeline && len(refs) > 0 {
			page := refs[:min(s.listPage, len(refs))]
			refs = refs[len(page):]
			args := make([]any, len(page))
			for i, r := range page {
				args[i] = r.ID
			}
			cmds = append(cmds, batch.Run(ctx, leaseMessagesScript, keys, args...))
			pages = append(pages, page)
		}
		batch.Exec(ctx)
		for i, c := range cmds {
			reply, err := c.Slice()
			if err == nil && len(reply) != len(pages[i]) {
				err = fmt.Errorf("reply has %d values for %d tasks", len(reply), len(pages[i]))
			}
			if err != nil {
				return tasks, bad, fmt.Errorf("read lease-expired tasks of queue %q: %w", queue, err)
			}
			for j, ref := range pages[i] {
				switch v := reply[j].(type) {
				case string:
					le, err := decodeLeaseExpired(queue, ref, v)
					if err != nil {
						bad = append(bad, BadTask{ID: ref.ID, Err: err})
						continue
					}
					tasks = append(tasks, le)
				case int64:
					if v == 0 {
						bad = append(bad, BadTask{ID: ref.ID, Err: fmt.Errorf("queue %q task %q: %w", queue, ref.ID, ErrNoMessage)})
					}
				}
			}
		}
	}
	return tasks, bad, nil
}

func decodeLeaseExpired(queue string, ref LeaseRef, raw string) (LeaseExpired, error) {
	msg, err := DecodeTaskMessage([]byte(raw))
	if err != nil {
		return LeaseExpired{}, fmt.Errorf("queue %q task %q: %w", queue, ref.ID, err)
	}
	if msg.ID != ref.ID || msg.Queue != queue {
		return LeaseExpired{}, fmt.Errorf("queue %q task %q: message says id %q queue %q: %w",
			queue, ref.ID, msg.ID, msg.Queue, ErrMismatch)
	}
	return LeaseExpired{Msg: msg, LeaseExpiry: ref.LeaseExpiry, MsgHash: MsgHash([]byte(raw))}, nil
}

// SortTailFirst orders refs by where their tasks sit in queue's active
// list, nearest the tail (the oldest) first, and those not found last, in
// their order. RecoverBatch takes a chunk whose tasks fill one stretch of
// the list's tail off the list through a window; batches cut from refs in
// this order are such stretches. It reads the list (listDepths) only when
// RecoverBatch would: on a short list, or for few refs, the order stays as
// it is.
func (s *Store) SortTailFirst(ctx context.Context, queue string, refs []LeaseRef) error {
	if err := s.CheckQueue(queue); err != nil {
		return err
	}
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.ID
	}
	depth, err := s.listDepths(ctx, Keys(queue), ids)
	if err != nil {
		return fmt.Errorf("order lease-expired tasks of queue %q: %w", queue, err)
	}
	sortByDepth(refs, depth)
	return nil
}

// sortByDepth orders refs by their tail depth in depth, unknown last. The
// depths are looked up once, not in every comparison, and the listing's
// order breaks ties (the refs not found).
func sortByDepth(refs []LeaseRef, depth map[string]int) {
	type placed struct {
		ref          LeaseRef
		depth, index int
	}
	all := make([]placed, len(refs))
	for i, r := range refs {
		all[i] = placed{r, depth[r.ID], i}
	}
	slices.SortFunc(all, func(a, b placed) int {
		return cmp.Or(compareDepth(a.depth, b.depth), cmp.Compare(a.index, b.index))
	})
	for i := range all {
		refs[i] = all[i].ref
	}
}

// compareDepth orders tail depths ascending, unknown (0) last.
func compareDepth(a, b int) int {
	switch {
	case a == b:
		return 0
	case a == 0:
		return 1
	case b == 0:
		return -1
	}
	return cmp.Compare(a, b)
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
	k := Keys(queue)
	// Tail order: known positions ascending, unknown ones last.
	order := make([]int, len(decisions))
	depths := make([]int, len(decisions))
	for i := range order {
		order[i] = i
		depths[i] = depth[decisions[i].TaskID]
	}
	slices.SortStableFunc(order, func(a, b int) int { return compareDepth(depths[a], depths[b]) })

	now := s.now()
	tomb, err := tombstone()
	if err != nil {
		return err
	}
	keys := []string{
		k.Lease(), k.Active(), k.Retry(), k.Archived(), k.Processed(now), k.Failed(now),
		k.ProcessedTotal(), k.FailedTotal(), k.TaskPrefix(), Own(prefix, queue).Outbox(),
	}
	head := []any{
		cutoff.Unix(), now.Unix(), now.Add(statsTTL).Unix(), now.AddDate(0, 0, -archiveMaxAgeDays).Unix(),
		archiveMaxSize, s.trimBudget, tomb, int64(math.MaxInt64),
	}
	taken := 0 // list elements taken off the tail by earlier chunks
	trimMore := false
	type chunkCall struct {
		chunk []int
		cmd   *redis.Cmd
	}
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
		assumed := taken
		for len(calls) < recoverPipeline && start < len(order) {
			chunk := order[start:min(start+s.recoverChunk, len(order))]
			start += len(chunk)
			hints := make([]int, len(chunk))
			deepest := 0
			for j, i := range chunk {
				if dp := depths[i]; dp > 0 && dp-assumed >= 1 {
					hints[j] = dp - assumed
					deepest = max(deepest, hints[j])
				}
			}
			// A chunk whose tasks sit together at the tail goes through a
			// window: every element down to its deepest task leaves the
			// tail (recover.lua).
			window := 0
			if deepest > 0 && deepest <= windowMaxFactor*len(chunk) {
				window = deepest
			}
			// Events are batched when each is a JSON object, as the
			// recoverer's are.
			batchBytes := RecoveredBatchBytes
			for _, i := range chunk {
				if data := decisions[i].Record.Data; len(data) == 0 || data[0] != '{' {
					batchBytes = 0
				}
			}
			args := append(make([]any, 0, len(head)+3+9*len(chunk)), head...)
			args = append(args, window, batchBytes, outbox.BatchRecordTag)
			for j, i := range chunk {
				d := &decisions[i]
				hint := hints[j]
				action, fail := "r", "0"
				if d.Action == ActionArchive {
					action = "a"
				}
				if d.IsFailure {
					fail = "1"
				}
				args = append(args, d.TaskID, d.MsgHash, action, d.RetryAt.Unix(), fail, d.NewMsg,
					d.Record.ID, d.Record.Data, hint)
			}
			if window > 0 {
				assumed += window
			} else {
				for _, i := range chunk {
					if depths[i] > 0 {
						assumed++
					}
				}
			}
			calls = append(calls, chunkCall{chunk: chunk, cmd: batch.Run(ctx, recoverScript, keys, args...)})
		}
		batch.Exec(ctx)
		var firstErr error
		for _, c := range calls {
			reply, err := c.cmd.Slice()
			switch {
			case err != nil:
				err = fmt.Errorf("recover queue %q: %d tasks: %w", queue, len(c.chunk), err)
			case len(reply) != 3*len(c.chunk)+2:
				err = fmt.Errorf("recover queue %q: reply has %d values for %d tasks", queue, len(reply), len(c.chunk))
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
				if (rm == 1 || rm == 3) && depths[i] > 0 {
					taken++
				}
				outcomes[i].Status, outcomes[i].StreamID, outcomes[i].Searched = RecoverStatus(st), xid, rm >= 3
			}
			w, _ := reply[len(reply)-2].(int64)
			taken += int(w)
			if more, _ := reply[len(reply)-1].(int64); more == 1 {
				trimMore = true
			}
		}
		if firstErr != nil {
			return firstErr
		}
	}
	for n := 0; trimMore && n < maxTrimCalls; n++ {
		more, err := trimArchiveScript.Run(ctx, s.client, keys, head...).Int64()
		if err != nil {
			return fmt.Errorf("trim archive of queue %q: %w", queue, err)
		}
		trimMore = more == 1
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

// listDepths finds the tail depth (1 = last element) of ids in the active
// list by reading it from the tail in pages, stopping once
// every id is found. Depths counted from the tail stay valid while workers
// push at the head. It reads nothing when the list is short or the batch so
// small that LPOS is cheaper.
func (s *Store) listDepths(ctx context.Context, k QueueKeys, ids []string) (map[string]int, error) {
	n, err := s.client.LLen(ctx, k.Active()).Result()
	if err != nil {
		return nil, fmt.Errorf("active list length: %w", err)
	}
	if n < positionMinList || int64(len(ids))*n < positionMinWork {
		return map[string]int{}, nil
	}
	want := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		want[id] = struct{}{}
	}
	return s.readDepths(ctx, k, int(n), want)
}

// readDepths reads the active list (n long when asked) from the tail and
// returns the tail depth of each id in want, stopping once all are found,
// or of every element when want is nil.
func (s *Store) readDepths(ctx context.Context, k QueueKeys, n int, want map[string]struct{}) (map[string]int, error) {
	size := len(want)
	if want == nil {
		size = n
	}
	depth := make(map[string]int, size)
	// Pages are read positionPages at a time in one pipeline: Redis reads
	// the next while this side scans the last (at most a few pages more
	// than needed are read).
	for off := 0; (want == nil || len(want) > 0) && off < n; {
		pipe := s.client.Pipeline()
		var cmds []*redis.StringSliceCmd
		for p := 0; p < positionPages && off+p*positionPage < n; p++ {
			o := off + p*positionPage
			cmds = append(cmds, pipe.LRange(ctx, k.Active(), int64(-(o+positionPage)), int64(-(o+1))))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("read active list: %w", err)
		}
		for _, c := range cmds {
			page := c.Val()
			for j := len(page) - 1; j >= 0; j-- {
				id := page[j]
				if want == nil {
					if _, dup := depth[id]; !dup {
						depth[id] = off + len(page) - j
					}
					continue
				}
				if _, ok := want[id]; ok {
					depth[id] = off + len(page) - j
					delete(want, id)
				}
			}
			if len(page) < positionPage {
				return depth, nil
			}
			off += positionPage
		}
	}
	return depth, nil
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
