package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/scheduler"
)

func init() { entryCommands = append(entryCommands, newEntryTriggerCommand) }

// triggerResult is what `entry trigger --json` prints.
type triggerResult struct {
	ID        string `json:"id"`
	RequestID string `json:"request_id"`
	TaskID    string `json:"task_id"`
	Queue     string `json:"queue"`
	Created   bool   `json:"created"`
}

func newEntryTriggerCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var requestID string
	cmd := &cobra.Command{
		Use:   "trigger ID",
		Short: "Enqueue one task of an entry now, outside its schedule",
		Long: `Enqueue one task of the entry now, with the entry's task and options. The
schedule is not affected (the next tick fires as usual), and paused
entries can be triggered too.

Idempotent: the same --request-id enqueues at most once (for 24 hours), so
a retried trigger never runs the task twice. Without --request-id a random
one is used. The task id is printed; its fired event reaches the audit log
through a running replica. Needs Redis (--redis).

A trigger the queue refuses (a replica fired from a configuration newer
than the one read here, or the entry moved to another queue meanwhile) is
tried again on the current configuration, twice at most; if it is still
refused, nothing is enqueued and the command exits non-zero with the reason.`,
		Example: `  cronstream entry trigger report
  cronstream entry trigger report --request-id deploy-2025-03-01`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if requestID == "" {
				requestID = events.NewEventID()
			} else if err := events.ValidateID(requestID); err != nil {
				return fmt.Errorf("--request-id: must be 1-128 characters of A-Z a-z 0-9 _ -")
			}
			m, st, done, err := manualFor(ctx, g, &conn, args[0])
			if err != nil {
				return err
			}
			defer done()
			taskID, created, err := m.Trigger(ctx, st, requestID)
			if err != nil {
				return err
			}
			out := triggerResult{ID: args[0], RequestID: requestID, TaskID: taskID, Queue: st.Entry.Options.QueueName(), Created: created}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			if created {
				fmt.Fprintf(w, "triggered entry %s: task %s enqueued to queue %s at %s\n", out.ID, terminalSafe(taskID), terminalSafe(out.Queue), fmtTime(time.Now()))
			} else {
				fmt.Fprintf(w, "request %s was already served: task %s (nothing enqueued now)\n", terminalSafe(requestID), terminalSafe(taskID))
			}
			if st.Entry.Paused {
				fmt.Fprintf(w, "note: entry %s is paused; its schedule stays paused\n", out.ID)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&requestID, "request-id", "", "idempotency key: the same id enqueues at most once (default: random)")
	addJSONResult(cmd, g)
	addConn(cmd, &conn, true)
	return cmd
}

// manualFor opens what a manual fire of entry id needs (trigger, backfill):
// a scheduler.Manual over Redis and JetStream, and the entry's Target (the
// config stream's last sequence, then its state). done closes both
// connections.
func manualFor(ctx context.Context, g *globalFlags, conn *connFlags, id string) (m scheduler.Manual, t scheduler.Target, done func(), err error) {
	s, err := openStreamsSession(ctx, g, conn)
	if err != nil {
		return m, t, nil, err
	}
	// The entry first: an unknown entry is "not found" whatever Redis's
	// state.
	m = scheduler.Manual{JS: s.js, Names: s.names, Source: s.source}
	if t, err = m.Load(ctx, id); err != nil {
		s.Close()
		return m, t, nil, err
	}
	_, rc, err := openStore(ctx, g, conn)
	if err != nil {
		s.Close()
		return m, t, nil, err
	}
	m.Redis = rc
	return m, t, func() { _ = rc.Close(); s.Close() }, nil
}
