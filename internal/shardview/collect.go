// Package shardview is the one read of shard ownership that status and the
// console's overview show: every replica's report of what it owns (its
// heartbeat carries a Report) joined with the shard leases in Redis. It
// reads; it never takes, renews or releases a lease (internal/ownership
// does).
package shardview

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Report is what a replica owns and sees of the shard leases (its
// heartbeat carries it, for status).
type Report struct {
	// Shards is the number of shards (queues × events.ShardsPerQueue).
	Shards int `json:"shards"`
	// Owned is how many this replica holds with a lease still valid by
	// its clock (it fires them); Desired how many it should hold by its
	// view of the membership.
	Owned   int `json:"owned"`
	Desired int `json:"desired"`
	// Unowned are the shards without a lease for longer than a takeover
	// takes (at most a few named, UnownedCount counts them all).
	Unowned      []string `json:"unowned,omitempty"`
	UnownedCount int      `json:"unowned_count,omitempty"`
	// NotLive counts leases held by replicas that are not live members.
	NotLive int `json:"not_live,omitempty"`
	// OldestRenewal is the age of the least recently renewed lease, in
	// seconds (a stuck owner's lease ages up to the lease term).
	OldestRenewal float64 `json:"oldest_renewal_seconds"`
	// Handed in and out, taken over, lost: this replica's counts since
	// it started.
	HandoversIn  uint64 `json:"handovers_in,omitempty"`
	HandoversOut uint64 `json:"handovers_out,omitempty"`
	Takeovers    uint64 `json:"takeovers,omitempty"`
	// Problem says why this replica holds back (not renewing, leases
	// unreadable), "" when none.
	Problem string `json:"problem,omitempty"`
}

// Overview is shard ownership as `cronstream status` and the console's
// overview show it, from one reading (Collect): the leases as Redis holds
// them, joined with what each replica reports of its own.
type Overview struct {
	// Total shards: queues × PerQueue.
	Total    int `json:"total"`
	Queues   int `json:"queues"`
	PerQueue int `json:"per_queue"`
	// ByReplica is, per holder of leases and per replica that owns
	// shards, what it holds and reports, sorted by replica.
	ByReplica []ReplicaShards `json:"by_replica"`
	// Unowned are shards without a lease (at most a few named).
	Unowned      []string `json:"unowned"`
	UnownedCount int      `json:"unowned_count"`
	// OldestRenewal is the age of the least recently renewed lease, in
	// seconds: a stuck owner's lease ages up to the lease term.
	OldestRenewal float64 `json:"oldest_renewal_seconds"`
	// GlobalHolder holds the global duty (the key sweep), "" when nobody
	// does.
	GlobalHolder string `json:"global_duty,omitempty"`
	Error        string `json:"error,omitempty"`
}

// ReplicaShards is one replica's part of the Overview.
type ReplicaShards struct {
	Replica string `json:"replica"`
	// Owned is how many leases Redis holds for it; Desired how many it
	// should own by its own view (its heartbeat).
	Owned   int `json:"owned"`
	Desired int `json:"desired"`
	// Queues are the queues whose duties it holds (it holds their
	// shard 0): their outbox's relay, recoverer and fail-pause scan.
	Queues []string `json:"queues"`
	// OldestRenewal is the age of its least recently renewed lease, in
	// seconds.
	OldestRenewal float64 `json:"oldest_renewal_seconds"`
	HandoversIn   uint64  `json:"handovers_in"`
	HandoversOut  uint64  `json:"handovers_out"`
	Takeovers     uint64  `json:"takeovers"`
	// Live says it has a heartbeat; a holder that has none is cut off
	// from NATS or of another deployment.
	Live    bool   `json:"live"`
	Problem string `json:"problem,omitempty"`
}

// Member is one replica's heartbeat as Collect reads it.
type Member struct {
	ID string
	// Shards: of a build that owns shards; Report is its last report.
	Shards bool
	Report *Report
}

// LeaseReader reads every shard lease of queues; *taskstate.Store
// implements it.
type LeaseReader interface {
	ShardLeases(ctx context.Context, prefix string, queues []string, heard bool) (taskstate.ShardLeaseView, error)
}

// maxUnownedNamed bounds the unowned shards an Overview names.
const maxUnownedNamed = 10

// Collect reads every shard lease of queues (the queues of the registered
// entries) and joins them with the members' reports; it returns the
// warnings to show beside them.
func Collect(ctx context.Context, leases LeaseReader, prefix string, queues []string, members []Member) (Overview, []string) {
	queues = slices.Compact(slices.Sorted(slices.Values(queues)))
	out := Overview{Queues: len(queues), PerQueue: events.ShardsPerQueue, Total: len(queues) * events.ShardsPerQueue,
		ByReplica: []ReplicaShards{}, Unowned: []string{}}
	view, err := leases.ShardLeases(ctx, prefix, queues, false)
	if err != nil {
		out.Error = err.Error()
		return out, nil
	}
	by := map[string]*ReplicaShards{}
	get := func(id string) *ReplicaShards {
		if by[id] == nil {
			by[id] = &ReplicaShards{Replica: id, Queues: []string{}}
		}
		return by[id]
	}
	var warnings []string
	for _, m := range members {
		if !m.Shards {
			warnings = append(warnings, fmt.Sprintf("replica %s is of an earlier build: it fires every entry (on time for the entries whose primary it is, 2 s late for the others) beside the owners of their shards, and runs the relay, recoverer and fail-pause scan of every queue", m.ID))
			continue
		}
		x := get(m.ID)
		x.Live = true
		if o := m.Report; o != nil {
			x.Desired, x.HandoversIn, x.HandoversOut, x.Takeovers, x.Problem = o.Desired, o.HandoversIn, o.HandoversOut, o.Takeovers, o.Problem
		}
		if x.Problem != "" {
			warnings = append(warnings, fmt.Sprintf("replica %s: %s", m.ID, x.Problem))
		}
	}
	held := map[events.Shard]bool{}
	global, _ := events.GlobalShard(queues)
	for _, l := range view.Leases {
		held[l.Shard] = true
		x := get(l.Holder)
		x.Owned++
		age := view.Now.Sub(l.Renewed).Seconds()
		x.OldestRenewal = max(x.OldestRenewal, age)
		out.OldestRenewal = max(out.OldestRenewal, age)
		if l.Shard.Index == 0 {
			x.Queues = append(x.Queues, l.Shard.Queue)
		}
		if l.Shard == global {
			out.GlobalHolder = l.Holder
		}
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
		slices.Sort(x.Queues)
		out.ByReplica = append(out.ByReplica, *x)
		if !x.Live && x.Owned > 0 {
			warnings = append(warnings, fmt.Sprintf("replica %s holds %d shard leases but has no heartbeat: cut off from NATS (it lets them lapse) or of another deployment on the same Redis and prefix", x.Replica, x.Owned))
		}
	}
	slices.SortFunc(out.ByReplica, func(a, b ReplicaShards) int { return strings.Compare(a.Replica, b.Replica) })
	return out, warnings
}
