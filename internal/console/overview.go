package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

type queueCount struct {
	Queue   string
	Entries entrystate.Counts
	// Tasks are the queue's asynq task counts; nil when unread (TasksErr
	// says why, or there is no Redis store).
	Tasks    *taskstate.QueueStats
	TasksErr string
}

// replicaRow is a replica with how far its projection is behind the
// config stream, as status computes it ("" when it is ahead of what was
// read here).
type replicaRow struct {
	Replica
	Lag string
}

type overviewData struct {
	Replicas    []replicaRow
	ReplicasErr string
	// Entries are counted as status counts them (entrystate.Count);
	// CompletedErr says why completed entries could not be told apart.
	Entries      entrystate.Counts
	CompletedErr string
	Backlog      int64
	HasBacklog   bool
	Late         []stall.Late
	Queues       []queueCount
	Quarantined  []projector.Quarantine
	Recoveries   []auditRow
	// ConfigSeq is the config stream's last sequence.
	ConfigSeq uint64
	// Shards is shard ownership as status shows it (shardview.Collect),
	// with its warnings; HasShards says it was read (a Redis store).
	Shards        shardview.Overview
	ShardWarnings []string
	HasShards     bool
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	src, ok := c.source(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	d := overviewData{ConfigSeq: c.configSeq(ctx, src)}
	var reps []Replica
	if src.Replicas != nil {
		var err error
		reps, err = src.Replicas(ctx)
		for _, rep := range reps {
			row := replicaRow{Replica: rep}
			if d.ConfigSeq >= rep.ConfigSeq {
				row.Lag = fmt.Sprint(d.ConfigSeq - rep.ConfigSeq)
			}
			d.Replicas = append(d.Replicas, row)
		}
		if err != nil {
			d.ReplicasErr = err.Error()
		}
	}
	if src.Backlog != nil {
		d.Backlog, d.HasBacklog = src.Backlog(), true
	}
	if src.Late != nil {
		d.Late = src.Late()
	}
	if src.Quarantined != nil {
		d.Quarantined = src.Quarantined()
	}
	states := c.entriesOf(src)
	left, err := c.firesLeft(ctx, src, states)
	if err != nil {
		d.CompletedErr = err.Error()
	}
	now := c.now(src)
	queues := map[string]*queueCount{}
	for _, st := range states {
		q := st.Entry.Options.QueueName()
		qc, ok := queues[q]
		if !ok {
			qc = &queueCount{Queue: q}
			queues[q] = qc
		}
		s := entrystate.Current(st, left, now)
		qc.Entries.Add(s)
		d.Entries.Add(s)
	}
	if src.Tasks != nil {
		c.queueTasks(ctx, src.Tasks, queues)
		d.Shards, d.ShardWarnings = shardsOf(ctx, src, states, reps)
		d.HasShards = true
	}
	for _, qc := range queues {
		d.Queues = append(d.Queues, *qc)
	}
	slices.SortFunc(d.Queues, func(a, b queueCount) int { return strings.Compare(a.Queue, b.Queue) })
	if rows, _, err := c.readAudit(ctx, src, auditQuery{Type: "cronstream.task.*", Stream: "activity"}, 10); err == nil {
		d.Recoveries = rows
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Live: true, Data: d})
}

// shardsOf reads shard ownership over the queues of the registered
// entries, as status does (shardview.Collect).
func shardsOf(ctx context.Context, src *Source, states []*projector.State, reps []Replica) (shardview.Overview, []string) {
	queues := make([]string, 0, len(states))
	for _, st := range states {
		queues = append(queues, st.Entry.Options.QueueName())
	}
	members := make([]shardview.Member, len(reps))
	for i, r := range reps {
		members[i] = shardview.Member{ID: r.ID, Shards: r.Shards, Report: r.Ownership}
	}
	return shardview.Collect(ctx, src.Tasks, src.Names.Prefix(), queues, members)
}

// configSeq is the config stream's last sequence, as status reads it;
// the projection's when the stream cannot be read.
func (c *Console) configSeq(ctx context.Context, src *Source) uint64 {
	if src.JS != nil {
		if st, err := src.JS.Stream(ctx, src.Names.ConfigStream()); err == nil {
			return st.CachedInfo().State.LastSeq
		}
	}
	if src.LastSeq != nil {
		return src.LastSeq()
	}
	return 0
}

// firesLeft reads the fires left of the limited entries among states
// (entrystate.FiresLeft); nil without Redis.
func (c *Console) firesLeft(ctx context.Context, src *Source, states []*projector.State) (map[string]entrystate.Left, error) {
	if src.Tasks == nil {
		return nil, nil
	}
	left, err := entrystate.FiresLeft(ctx, src.Tasks, src.Names.Prefix(), states)
	if err != nil {
		return nil, fmt.Errorf("completed entries unknown: %w", err)
	}
	return left, nil
}

// queueTasks reads the asynq task counts of every queue an entry names or
// asynq knows, one round trip per queue.
func (c *Console) queueTasks(ctx context.Context, store *taskstate.Store, queues map[string]*queueCount) {
	known, err := store.Queues(ctx)
	if err != nil {
		c.cfg.Logger.Warn("console: list asynq queues", "err", err)
	}
	for _, q := range known {
		if queues[q] == nil {
			queues[q] = &queueCount{Queue: q}
		}
	}
	for q, qc := range queues {
		qs, err := store.QueueStats(ctx, q)
		if err != nil {
			qc.TasksErr = err.Error()
			continue
		}
		qc.Tasks = &qs
	}
}
