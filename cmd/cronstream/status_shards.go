package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// shardsStatus is status's view of shard ownership (docs/design.md
// "Ownership"): the leases as Redis holds them, and what each replica
// reports of its own.
type shardsStatus struct {
	// Total shards: queues × PerQueue.
	Total    int `json:"total"`
	Queues   int `json:"queues"`
	PerQueue int `json:"per_queue"`
	// ByReplica is, per holder of leases and per replica that owns
	// shards, what it holds and reports.
	ByReplica []replicaShards `json:"by_replica"`
	// Unowned are shards without a lease (at most a few named).
	Unowned      []string `json:"unowned"`
	UnownedCount int      `json:"unowned_count"`
	// OldestRenewal is the age of the least recently renewed lease, in
	// seconds: a stuck owner's lease ages up to the lease term.
	OldestRenewal float64 `json:"oldest_renewal_seconds"`
	Error         string  `json:"error,omitempty"`
}

type replicaShards struct {
	Replica string `json:"replica"`
	// Owned is how many leases Redis holds for it; Desired how many it
	// should own by its own view (its heartbeat).
	Owned        int    `json:"owned"`
	Desired      int    `json:"desired"`
	HandoversIn  uint64 `json:"handovers_in"`
	HandoversOut uint64 `json:"handovers_out"`
	Takeovers    uint64 `json:"takeovers"`
	// Live says it has a heartbeat; a holder that has none is cut off
	// from NATS or of another deployment.
	Live    bool   `json:"live"`
	Problem string `json:"problem,omitempty"`
}

// maxUnownedNamed bounds the unowned shards status names.
const maxUnownedNamed = 10

// collectShards reads every shard lease of the queues of states and joins
// them with the replicas' reports; it returns the warnings to show.
func collectShards(ctx context.Context, store *taskstate.Store, names events.Names, states []projector.State, replicas []replica.Status) (shardsStatus, []string) {
	var queues []string
	for _, st := range states {
		queues = append(queues, st.Entry.Options.QueueName())
	}
	slices.Sort(queues)
	queues = slices.Compact(queues)
	out := shardsStatus{Queues: len(queues), PerQueue: events.ShardsPerQueue, Total: len(queues) * events.ShardsPerQueue,
		ByReplica: []replicaShards{}, Unowned: []string{}}
	view, err := store.ShardLeases(ctx, names.Prefix(), queues, false)
	if err != nil {
		out.Error = err.Error()
		return out, nil
	}
	by := map[string]*replicaShards{}
	get := func(id string) *replicaShards {
		if by[id] == nil {
			by[id] = &replicaShards{Replica: id}
		}
		return by[id]
	}
	var warnings []string
	for _, r := range replicas {
		if !r.Shards {
			warnings = append(warnings, fmt.Sprintf("replica %s is of an earlier build: it fires every entry (on time for the entries whose primary it is, 2 s late for the others) beside the owners of their shards", r.ID))
			continue
		}
		x := get(r.ID)
		x.Live = true
		if o := r.Ownership; o != nil {
			x.Desired, x.HandoversIn, x.HandoversOut, x.Takeovers, x.Problem = o.Desired, o.HandoversIn, o.HandoversOut, o.Takeovers, o.Problem
		}
		if x.Problem != "" {
			warnings = append(warnings, fmt.Sprintf("replica %s: %s", r.ID, x.Problem))
		}
	}
	held := map[events.Shard]bool{}
	for _, l := range view.Leases {
		held[l.Shard] = true
		get(l.Holder).Owned++
		out.OldestRenewal = max(out.OldestRenewal, view.Now.Sub(l.Renewed).Seconds())
	}
	for q, err := range view.Unreadable {
		warnings = append(warnings, fmt.Sprintf("the shard leases of queue %s cannot be read: %v", q, err))
	}
	for _, q := range queues {
		if _, bad := view.Unreadable[q]; bad {
			continue
		}
		for _, s := range events.QueueShards(q) {
			if !held[s] {
				out.UnownedCount++
				if len(out.Unowned) < maxUnownedNamed {
					out.Unowned = append(out.Unowned, s.String())
				}
			}
		}
	}
	if out.UnownedCount > 0 {
		warnings = append(warnings, fmt.Sprintf("%d of %d shards have no owner, so nobody fires their entries now (a replica takes a free shard within a few seconds; longer means no replica may own shards: none ready, or all cut off)", out.UnownedCount, out.Total))
	}
	for _, x := range by {
		out.ByReplica = append(out.ByReplica, *x)
		if !x.Live && x.Owned > 0 {
			warnings = append(warnings, fmt.Sprintf("replica %s holds %d shard leases but has no heartbeat: cut off from NATS (it lets them lapse) or of another deployment on the same Redis and prefix", x.Replica, x.Owned))
		}
	}
	slices.SortFunc(out.ByReplica, func(a, b replicaShards) int { return strings.Compare(a.Replica, b.Replica) })
	return out, warnings
}

// printShards prints status's Shards section.
func printShards(w io.Writer, s shardsStatus) {
	if s.Total == 0 && s.Error == "" {
		return
	}
	fmt.Fprintf(w, "\nShards: %d (%d queues × %d)", s.Total, s.Queues, s.PerQueue)
	if s.Error != "" {
		fmt.Fprintf(w, ", leases unknown: %s\n", terminalSafe(s.Error))
		return
	}
	fmt.Fprintf(w, ", %d without an owner", s.UnownedCount)
	if s.Total > s.UnownedCount {
		fmt.Fprintf(w, ", least recently renewed lease %s ago", (time.Duration(s.OldestRenewal * float64(time.Second))).Round(100*time.Millisecond))
	}
	fmt.Fprintln(w)
	if len(s.ByReplica) > 0 {
		tw := newTable(w)
		fmt.Fprintln(tw, "  REPLICA\tOWNED\tDESIRED\tHANDOVERS IN/OUT\tTAKEOVERS\tLIVE")
		for _, x := range s.ByReplica {
			live := "yes"
			if !x.Live {
				live = "no"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d/%d\t%d\t%s\n", terminalSafe(x.Replica), x.Owned, x.Desired, x.HandoversIn, x.HandoversOut, x.Takeovers, live)
		}
		tw.Flush()
	}
	if len(s.Unowned) > 0 {
		more := ""
		if s.UnownedCount > len(s.Unowned) {
			more = fmt.Sprintf(" and %d more", s.UnownedCount-len(s.Unowned))
		}
		fmt.Fprintf(w, "  without an owner: %s%s\n", terminalSafe(strings.Join(s.Unowned, " ")), more)
	}
}
