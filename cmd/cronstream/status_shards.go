package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// shardsStatus is status's view of shard ownership (docs/design.md
// "Ownership"), read by the collector the console's overview shares.
type shardsStatus = shardview.Overview

// collectShards reads every shard lease of the queues of states and joins
// them with the replicas' reports; it returns the warnings to show.
func collectShards(ctx context.Context, store *taskstate.Store, names events.Names, states []projector.State, replicas []replica.Status) (shardsStatus, []string) {
	queues := make([]string, 0, len(states))
	for _, st := range states {
		queues = append(queues, st.Entry.Options.QueueName())
	}
	return shardview.Collect(ctx, store, names.Prefix(), queues, replica.Members(replicas))
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
		fmt.Fprintf(w, ", least recently renewed lease %s ago", seconds(s.OldestRenewal))
	}
	fmt.Fprintln(w)
	if len(s.ByReplica) > 0 {
		tw := newTable(w)
		fmt.Fprintln(tw, "  REPLICA\tOWNED\tDESIRED\tOLDEST LEASE\tHANDOVERS IN/OUT\tTAKEOVERS\tLIVE\tQUEUE DUTIES")
		for _, x := range s.ByReplica {
			live := "yes"
			if !x.Live {
				live = "no"
			}
			duties := strings.Join(x.Queues, ",")
			if x.Replica == s.GlobalHolder {
				duties = strings.TrimPrefix(duties+" +global", " ")
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%d/%d\t%d\t%s\t%s\n", terminalSafe(x.Replica), x.Owned, x.Desired, seconds(x.OldestRenewal),
				x.HandoversIn, x.HandoversOut, x.Takeovers, live, terminalSafe(cmp.Or(duties, "—")))
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

// seconds prints a duration in seconds to a tenth.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond)
}
