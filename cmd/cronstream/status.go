package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/stall"
)

func init() { subcommands = append(subcommands, newStatusCommand) }

// recovererNote is said plainly wherever recovery is shown (docs/design.md
// "Recovery of lease-expired tasks").
const recovererNote = "asynq servers run their own recoverer (every minute, 30s cutoff) and it cannot be switched off; " +
	"cronstream's recoverer acts first with its defaults (every 5s, 20s grace: 20-25s after a lease expired). " +
	"A task asynq recovers first has no cronstream event."

// statusReport is everything `status` shows; --json prints it as is.
type statusReport struct {
	Prefix    string           `json:"prefix"`
	Replicas  []replica.Status `json:"replicas"`
	Shards    shardsStatus     `json:"shards"`
	Entries   entryCounts      `json:"entries"`
	Config    streamPosition   `json:"config_stream"`
	Activity  streamPosition   `json:"activity_stream"`
	Outbox    outboxStatus     `json:"outbox"`
	Queues    []queueStatus    `json:"queues"` // null, with QueuesErr, when Redis could not be read
	QueuesErr string           `json:"queues_error,omitempty"`
	NextFires []nextFireView   `json:"next_fires"`
	// Late are the entries whose tick is overdue for longer than
	// LateAfter, oldest first, with the reason their fires failed as the
	// replicas report it.
	Late      []stall.Late `json:"late"`
	LateAfter string       `json:"late_after"`
	Warnings  []string     `json:"warnings"`
	Notes     []string     `json:"notes"`
	Errors    []string     `json:"errors,omitempty"`
}

// entryCounts are the entries in each state (entrystate.Count, as the
// console's overview counts them) and the quarantined ones.
type entryCounts struct {
	entrystate.Counts
	Quarantined int              `json:"quarantined"`
	Bad         []quarantineView `json:"quarantined_entries,omitempty"`
	// FailurePaused are entries paused on failure (failpause), reason in
	// the note, at most maxFailurePaused of them.
	FailurePaused []quarantineView `json:"paused_on_failure,omitempty"`
	// CompletedIDs are the completed entries, at most maxFailurePaused.
	CompletedIDs []string `json:"completed_entries,omitempty"`
	// CountUnknown are the completed entries among them whose fires count
	// could not be rebuilt after Redis lost data.
	CountUnknown []string `json:"max_fires_count_unknown,omitempty"`
}

const maxFailurePaused = 20

type quarantineView struct {
	ID       string    `json:"id"`
	Revision uint64    `json:"revision"`
	Time     time.Time `json:"time"`
	Reason   string    `json:"reason"`
}

type streamPosition struct {
	Stream   string     `json:"stream"`
	LastSeq  uint64     `json:"last_seq"`
	LastTime *time.Time `json:"last_time,omitempty"`
	Messages uint64     `json:"messages"`
}

type outboxStatus struct {
	// Backlog is the number of fire and recovery records in Redis that the
	// relay has not yet published to the activity stream; null, with
	// Error, when it could not be read.
	Backlog *int64           `json:"backlog"`
	ByQueue map[string]int64 `json:"by_queue"`
	Error   string           `json:"error,omitempty"`
}

type queueStatus struct {
	Queue          string `json:"queue"`
	Pending        int64  `json:"pending"`
	Active         int64  `json:"active"`
	Scheduled      int64  `json:"scheduled"`
	Retry          int64  `json:"retry"`
	Archived       int64  `json:"archived"`
	Completed      int64  `json:"completed"`
	Processed      int64  `json:"processed"`
	Failed         int64  `json:"failed"`
	ProcessedToday int64  `json:"processed_today"`
	FailedToday    int64  `json:"failed_today"`
	Paused         bool   `json:"paused"`
	Outbox         int64  `json:"outbox"`
	// Held are the ticks held by overlap buffer-one now, HeldDropped those
	// dropped rather than fired (entry paused, removed, moved or off
	// buffer-one), ever.
	Held        int64 `json:"held"`
	HeldDropped int64 `json:"held_dropped"`
}

type nextFireView struct {
	Entry string    `json:"entry"`
	Queue string    `json:"queue"`
	Time  time.Time `json:"time"`
}

// maxNextFires is how many upcoming fires status lists.
const maxNextFires = 10

func newStatusCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var output outputFlag
	var lateAfter, clockOffset time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show replicas, entries, backlog, queues and the next fires",
		Long: `Show the state of one cronstream tenant (--prefix):

  replicas      replicas from their heartbeats: live, or unresponsive (no
                beat for three heartbeats: frozen, killed or cut off;
                listed for 5m after their last beat), and whether each is
                ready (its /readyz, when reachable from here)
  entries       active, paused and quarantined (last config event cannot
                be applied: the entry does not fire until fixed)
  streams       last sequence and time of the config and activity streams
  outbox        fire and recovery records in Redis not yet published to the
                activity stream (the relay's backlog)
  queues        asynq's sizes and counters per queue
  next fires    the next ticks of the active entries
  late          entries whose tick is overdue for longer than --late-after
                (computed here from the projection and the watermarks in
                Redis), with the last refusal or error the replicas saw
  warnings      Redis settings that break exactly-once (eviction, no
                persistence); stream settings that differ from a
                replica's flags (which it leaves as they are)

Ages, next fires and lateness are taken on the replicas' clock: this
host's clock corrected to Redis TIME, so a host whose clock is off shows
what the replicas see. Without Redis they fall back to this host's clock,
and a note says so.

Exits non-zero when a part could not be read (what could be read is
still shown).`,
		Example: `  cronstream status
  cronstream status --json | jq .outbox.backlog`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			format, err := output.resolve(cmd)
			if err != nil {
				return err
			}
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			rep := collectStatus(ctx, g, &conn, s, lateAfter, clockOffset)
			printed, err := printStructured(cmd.OutOrStdout(), format, rep)
			if err != nil {
				return err
			}
			if !printed {
				printStatus(cmd.OutOrStdout(), rep)
			}
			if len(rep.Errors) > 0 {
				return fmt.Errorf("status incomplete: %s", strings.Join(rep.Errors, "; "))
			}
			return nil
		},
	}
	addOutput(cmd, &output, outTable, outWide, outJSON, outYAML)
	cmd.Flags().DurationVar(&lateAfter, "late-after", stall.DefaultLateAfter, "list an entry as late when its tick is overdue (due time plus jitter) for longer than this")
	cmd.Flags().DurationVar(&clockOffset, "test-clock-offset", 0, "TEST ONLY: run this command's local clock this far off, to test clock skew")
	_ = cmd.Flags().MarkHidden("test-clock-offset")
	addConn(cmd, &conn, true)
	return cmd
}
