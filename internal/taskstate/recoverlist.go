package taskstate

// Finding what to recover: the lease-expired tasks of a queue, listed in
// bounded pages and loaded with their messages, and where they sit in the
// active list, so that RecoverBatch takes them off its tail in order.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/redisscript"
)

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
