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

// Queue change = handover (docs/invariants.md INV-handover). The watermark lives in the queue's
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
	_, err := s.seedWatermark(ctx, prefix, newQueue, entry, tick, taskID, revision, configID, nil)
	return err
}

// LostRecord is the outbox record of fires a restore found lost
// (events.TypeTaskLost), and the watermark the loss was found at (Found;
// FoundNone when there was none).
type LostRecord struct {
	Record
	Found     time.Time
	FoundNone bool
}

// RestoreWatermark is SeedWatermark for a watermark Redis lost: when lost
// is set, it appends lost's record to the queue's outbox in the same step,
// if the watermark still holds lost.Found (or none, with FoundNone) and
// the step raises it, and reports whether it did. A replica whose restore
// of the same loss comes second finds the watermark raised, and records
// nothing.
func (s *Store) RestoreWatermark(ctx context.Context, prefix, queue, entry string, tick time.Time, taskID string, revision uint64, configID string, lost *LostRecord) (bool, error) {
	if lost != nil {
		if err := checkRecord("lost", lost.Record, true); err != nil {
			return false, err
		}
		// A flush took the set of outboxes too: a relay must find this one.
		if err := s.RegisterOutbox(ctx, prefix, queue); err != nil {
			return false, err
		}
	}
	return s.seedWatermark(ctx, prefix, queue, entry, tick, taskID, revision, configID, lost)
}

func (s *Store) seedWatermark(ctx context.Context, prefix, newQueue, entry string, tick time.Time, taskID string, revision uint64, configID string, lost *LostRecord) (bool, error) {
	if entry == "" || newQueue == "" {
		return false, fmt.Errorf("seed watermark of entry %q in queue %q: %w: empty entry or queue", entry, newQueue, ErrInvalidFire)
	}
	own := Own(prefix, newQueue)
	ms := ""
	if !tick.IsZero() {
		ms = strconv.FormatInt(tick.UnixMilli(), 10)
	}
	args := []any{revision, ms, taskID, configID}
	if lost != nil {
		found := ""
		if !lost.FoundNone {
			found = strconv.FormatInt(lost.Found.UnixMilli(), 10)
		}
		args = append(args, found, lost.ID, lost.Data)
	}
	reply, err := seedWatermarkScript.Run(ctx, s.client, []string{own.Handover(entry), own.Watermark(entry), own.Fence(), own.HandoverID(entry), own.Outbox()}, args...).Slice()
	if err != nil {
		return false, fmt.Errorf("seed watermark of entry %q in queue %q at revision %d: %w", entry, newQueue, revision, err)
	}
	if seeded, _ := reply[0].(int64); seeded != 1 {
		marker, _ := reply[1].(string)
		return false, fmt.Errorf("seed watermark of entry %q in queue %q at revision %d (slot marker %q): %w", entry, newQueue, revision, marker, ErrHandoverSuperseded)
	}
	recorded := len(reply) > 2 && reply[2] == int64(1)
	return recorded, nil
}

// Stream epochs (docs/invariants.md INV-revision-fence). The revision fence and
// the handover markers hold config stream sequences. When the config stream
// is deleted and recreated, or restored from an older snapshot, they may name
// sequences the stream no longer has, or that hold another message (the ids
// stored beside them, FenceID and HandoverID, tell); a replica that finds so
// (scheduler) clears them with ClearFence and ClearHandover. Both compare
// first: they clear only the value the replica checked, so two replicas
// clearing at once do not fight, and a fence another replica raised
// meanwhile (from the new stream) stays.

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
