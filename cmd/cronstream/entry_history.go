package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
)

func init() { entryCommands = append(entryCommands, newEntryHistoryCommand) }

// historyRecord is one config event of `entry history --json`.
type historyRecord struct {
	Revision uint64        `json:"revision"`
	Time     time.Time     `json:"time"`
	Type     string        `json:"type"`
	Source   string        `json:"source,omitempty"`
	EventID  string        `json:"event_id,omitempty"`
	Changes  []string      `json:"changes,omitempty"`
	Entry    *events.Entry `json:"entry,omitempty"`
	Error    string        `json:"error,omitempty"`
	// FailPause: a replica's fail-pause request (pause on failure), not a
	// config event an operator published.
	FailPause bool `json:"fail_pause,omitempty"`
	// Refused (with --all only) says why the message changed nothing.
	Refused string `json:"refused,omitempty"`
}

func newEntryHistoryCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var output outputFlag
	var all bool
	cmd := &cobra.Command{
		Use:   "history ID",
		Short: "Show every config event of an entry, oldest first",
		Long: `Show an entry's configuration history from the config stream: each
revision with when it was stored, its event type, who published it
(source) and what it changed. Removed entries keep their history; events
that cannot be applied are shown with the reason. A pause on failure is a
fail-pause request a replica published (type paused, "on failure"), not a
config event. With --all, the messages of the entry's history that
changed nothing are shown too, with why: fail-pause requests that do not
hold, NATS server replies stored on its subjects. -o wide adds each
event's id; -o json and -o yaml print the records with each revision's
full state; -o name prints event/<event id> for each row that is an event,
as audit -o name does.`,
		Example: `  cronstream entry history report
  cronstream entry history report --json | jq '.[] | select(.type=="cronstream.entry.updated")'`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
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
			history := s.client.History
			if all {
				history = s.client.HistoryAll
			}
			recs, err := history(ctx, args[0])
			if err != nil {
				return err
			}
			out := make([]historyRecord, 0, len(recs))
			var prev *events.Entry
			for _, r := range recs {
				h := historyRecord{Revision: r.Seq, Time: r.Time.UTC(), Entry: r.Entry}
				if r.Event != nil {
					h.Type, h.Source, h.EventID = r.Event.Type, r.Event.Source, r.Event.ID
				}
				if r.Err != nil {
					h.Error = r.Err.Error()
				}
				h.FailPause = r.FailPause
				if r.Refused != nil {
					h.Refused = r.Refused.Error()
					out = append(out, h)
					continue
				}
				h.Changes = changeSummary(h.Type, prev, r.Entry)
				if r.Entry != nil {
					prev = r.Entry
				}
				out = append(out, h)
			}
			if ok, err := printStructured(cmd.OutOrStdout(), format, out); ok {
				return err
			}
			if format == outName {
				return printHistoryNames(cmd.OutOrStdout(), out)
			}
			return printHistoryTable(cmd.OutOrStdout(), out, format == outWide)
		},
	}
	addOutput(cmd, &output, outTable, outWide, outJSON, outYAML, outName)
	cmd.Flags().BoolVar(&all, "all", false, "also show the messages that changed nothing (refused fail-pause requests, NATS server replies)")
	addConn(cmd, &conn, false)
	return cmd
}

// printHistoryTable prints one row a record; wide adds each event's id.
func printHistoryTable(w io.Writer, out []historyRecord, wide bool) error {
	times := timesFor(w)
	tw := newTable(w)
	head := "REVISION\tTIME\tTYPE\tSOURCE\tCHANGE"
	if wide {
		head += "\tEVENT ID"
	}
	fmt.Fprintln(tw, head)
	for _, h := range out {
		change := strings.Join(h.Changes, "; ")
		switch {
		case h.Refused != "":
			change = "REFUSED, changed nothing: " + h.Refused
		case h.Error != "":
			change = "cannot be applied: " + h.Error
		case h.FailPause:
			change = "on failure (fail-pause request): " + change
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s", h.Revision, times.at(h.Time), terminalSafe(dash(events.DisplayType(h.Type))), terminalSafe(dash(h.Source)), terminalSafe(dash(change)))
		if wide {
			fmt.Fprintf(tw, "\t%s", terminalSafe(dash(h.EventID)))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// printHistoryNames prints the name of each record's event, as audit -o
// name does; a message that is no event (a NATS server's reply, one that
// cannot be decoded) has none and is left out.
func printHistoryNames(w io.Writer, recs []historyRecord) error {
	for _, h := range recs {
		if h.EventID == "" {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s%s\n", eventNamePrefix, terminalSafe(h.EventID)); err != nil {
			return err
		}
	}
	return nil
}

// changeSummary says what one config event did, from the previous state.
func changeSummary(typ string, prev, cur *events.Entry) []string {
	if cur == nil {
		return nil
	}
	switch events.ConfigKind(typ) {
	case events.TypeEntryRegistered:
		return []string{fmt.Sprintf("cron %q, type %s, queue %s", cur.Cron, cur.Task.Type, cur.Options.QueueName())}
	case events.TypeEntryPaused:
		if cur.Note != "" {
			return []string{fmt.Sprintf("note %q", cur.Note)}
		}
		return nil
	case events.TypeEntryResumed, events.TypeEntryRemoved:
		return nil
	}
	base := events.Entry{}
	if prev != nil {
		base = *prev
	}
	var out []string
	for _, c := range configsync.Diff(base, *cur) {
		out = append(out, c.String())
	}
	return out
}
