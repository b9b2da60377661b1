package taskstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Restore proposals (docs/invariants.md INV-restore). When Redis loses an
// entry's watermark, the replica that notices first may know less than
// another running replica: the other one fired a later tick whose record
// went with Redis before the relay published it. Seeding the watermark
// from the first replica's position alone fires that tick again. So the
// seed is proposed in the slot instead: every replica that finds the
// proposal raises it to its own position, and only once the proposal has
// settled (a delay long enough for every live replica's loop to have read
// the slot's proposals) does a replica seed the watermark from it
// (SeedWatermark) and clear it (ClearRestore).

// RestoreProposal is an entry's restore proposal as ProposeRestore finds it.
type RestoreProposal struct {
	// Found is false when the slot holds no proposal for the entry (and
	// none was proposed).
	Found bool
	// Restored: there was no proposal, and the watermark is at or past
	// the tick proposed (another replica restored it); nothing was
	// proposed.
	Restored bool
	Tick     time.Time
	TaskID   string
	// Settled: the proposal may seed the watermark now; otherwise it
	// settles in Left.
	Settled bool
	Left    time.Duration
}

// ProposeRestore raises entry's restore proposal in queue's slot to tick
// (with taskID), creating it to settle after settle when there is none, and
// returns the proposal. A zero tick proposes nothing: it only reads. With
// no proposal and a watermark at or past tick, it proposes nothing and
// reports Restored.
func (s *Store) ProposeRestore(ctx context.Context, prefix, queue, entry string, tick time.Time, taskID string, settle time.Duration) (RestoreProposal, error) {
	ms := ""
	if !tick.IsZero() {
		ms = strconv.FormatInt(tick.UnixMilli(), 10)
	}
	return s.proposeRestore(ctx, prefix, queue, entry, ms, taskID, settle)
}

// OpenRestore creates entry's restore proposal in queue's slot without a
// position, to settle after settle, when there is none, and returns the
// proposal: a replica that holds no position for the entry and cannot read
// the activity stream opens it so the replicas that hold one raise it
// (ProposeRestore does not create a proposal without a tick). A settled
// proposal that no replica raised has a zero Tick.
func (s *Store) OpenRestore(ctx context.Context, prefix, queue, entry string, settle time.Duration) (RestoreProposal, error) {
	return s.proposeRestore(ctx, prefix, queue, entry, noPositionMs, "", settle)
}

// noPositionMs is the tick of a proposal opened without a position
// (OpenRestore): below every real one, so any position raises it.
const noPositionMs = "-1"

func (s *Store) proposeRestore(ctx context.Context, prefix, queue, entry, ms, taskID string, settle time.Duration) (RestoreProposal, error) {
	if entry == "" || queue == "" {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: %w: empty entry or queue", entry, queue, ErrInvalidFire)
	}
	own := Own(prefix, queue)
	reply, err := runScript(ctx, s.client, proposeRestoreScript, []string{own.Restore(), own.Watermark(entry)}, entry, ms, taskID, settle.Milliseconds())
	if err != nil {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: %w", entry, queue, err)
	}
	code, _ := reply[0].(int64)
	switch code {
	case 0:
		return RestoreProposal{}, nil
	case 3:
		return RestoreProposal{Restored: true}, nil
	}
	if len(reply) < 3 {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: unexpected reply %v", entry, queue, reply)
	}
	tickText, _ := reply[1].(string)
	p := RestoreProposal{Found: true, Settled: code == 2}
	p.TaskID, _ = reply[2].(string)
	t, ok := proposalTick(tickText)
	if !ok {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: malformed proposal tick %q", entry, queue, tickText)
	}
	p.Tick = t
	if !p.Settled && len(reply) > 3 {
		left, _ := reply[3].(int64)
		p.Left = time.Duration(left) * time.Millisecond
	}
	return p, nil
}

// proposalTick reads a proposal's tick: zero for one opened without a
// position.
func proposalTick(text string) (time.Time, bool) {
	n, err := strconv.ParseInt(text, 10, 64)
	switch {
	case err != nil:
		return time.Time{}, false
	case n < 0:
		return time.Time{}, true
	}
	return time.UnixMilli(n).UTC(), true
}

// ClearRestore deletes entry's restore proposal in queue's slot if it still
// proposes tick (zero: one opened without a position that no replica
// raised), once the watermark was seeded from it or the entry found never
// fired.
func (s *Store) ClearRestore(ctx context.Context, prefix, queue, entry string, tick time.Time) error {
	ms := noPositionMs
	if !tick.IsZero() {
		ms = strconv.FormatInt(tick.UnixMilli(), 10)
	}
	err := clearRestoreScript.Run(ctx, s.client, []string{Own(prefix, queue).Restore()}, entry, ms).Err()
	if err != nil {
		return fmt.Errorf("clear the restore proposal of entry %q in queue %q: %w", entry, queue, err)
	}
	return nil
}

// RestoreProposals returns the tick each entry's restore proposal holds in
// each of queues (zero for one opened without a position) (one pipelined round trip; a queue with no proposal is
// absent from the result).
func (s *Store) RestoreProposals(ctx context.Context, prefix string, queues []string) (map[string]map[string]time.Time, error) {
	if len(queues) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	reads := make([]*redis.MapStringStringCmd, len(queues))
	for i, q := range queues {
		reads[i] = pipe.HGetAll(ctx, Own(prefix, q).Restore())
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read restore proposals of %d queues: %w", len(queues), err)
	}
	var out map[string]map[string]time.Time
	for i, q := range queues {
		for entry, v := range reads[i].Val() {
			msText, _, _ := strings.Cut(v, " ")
			tick, ok := proposalTick(msText)
			if !ok {
				continue // not one of ours: ProposeRestore replaces it
			}
			if out == nil {
				out = map[string]map[string]time.Time{}
			}
			if out[q] == nil {
				out[q] = map[string]time.Time{}
			}
			out[q][entry] = tick
		}
	}
	return out, nil
}
