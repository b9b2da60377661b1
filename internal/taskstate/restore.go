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
	if entry == "" || queue == "" {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: %w: empty entry or queue", entry, queue, ErrInvalidFire)
	}
	ms := ""
	if !tick.IsZero() {
		ms = strconv.FormatInt(tick.UnixMilli(), 10)
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
	n, err := strconv.ParseInt(tickText, 10, 64)
	if err != nil {
		return RestoreProposal{}, fmt.Errorf("propose a restore of entry %q in queue %q: malformed proposal tick %q", entry, queue, tickText)
	}
	p.Tick = time.UnixMilli(n).UTC()
	if !p.Settled && len(reply) > 3 {
		left, _ := reply[3].(int64)
		p.Left = time.Duration(left) * time.Millisecond
	}
	return p, nil
}

// ClearRestore deletes entry's restore proposal in queue's slot if it still
// proposes tick, once the watermark was seeded from it.
func (s *Store) ClearRestore(ctx context.Context, prefix, queue, entry string, tick time.Time) error {
	err := clearRestoreScript.Run(ctx, s.client, []string{Own(prefix, queue).Restore()}, entry, strconv.FormatInt(tick.UnixMilli(), 10)).Err()
	if err != nil {
		return fmt.Errorf("clear the restore proposal of entry %q in queue %q: %w", entry, queue, err)
	}
	return nil
}

// RestoreProposals returns the tick each entry's restore proposal holds in
// each of queues (one pipelined round trip; a queue with no proposal is
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
			ms, err := strconv.ParseInt(msText, 10, 64)
			if err != nil {
				continue // not one of ours: ProposeRestore replaces it
			}
			if out == nil {
				out = map[string]map[string]time.Time{}
			}
			if out[q] == nil {
				out[q] = map[string]time.Time{}
			}
			out[q][entry] = time.UnixMilli(ms).UTC()
		}
	}
	return out, nil
}
