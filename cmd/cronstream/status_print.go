package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/stall"
)

// printStatus prints status's text form: a printer per section, each
// starting with the blank line that sets it apart.
func printStatus(w io.Writer, r statusReport) {
	fmt.Fprintf(w, "cronstream status (prefix %s)\n\n", r.Prefix)
	printReplicas(w, r.Replicas, r.Config.LastSeq)
	printShards(w, r.Shards)
	printEntries(w, r.Entries)
	printStreams(w, r.Config, r.Activity)
	printOutbox(w, r.Outbox, r.Activity.Stream)
	printQueues(w, r.Queues, r.QueuesErr)
	printNextFires(w, r.NextFires)
	printLate(w, r.Late, r.LateAfter)
	printWarnings(w, r.Warnings)
	printNotes(w, r.Notes)
	printErrors(w, r.Errors)
}

// printable replaces control characters, so text from errors cannot drive
// the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// printReplicas prints the Replicas section: live and unresponsive ones,
// each with its lag behind configSeq, the config stream's last sequence.
func printReplicas(w io.Writer, replicas []replica.Status, configSeq uint64) {
	live := 0
	for _, x := range replicas {
		if x.State == replica.StateLive {
			live++
		}
	}
	fmt.Fprintf(w, "Replicas: %d live", live)
	if n := len(replicas) - live; n > 0 {
		fmt.Fprintf(w, ", %d unresponsive", n)
	}
	fmt.Fprintln(w)
	if len(replicas) > 0 {
		tw := newTable(w)
		fmt.Fprintln(tw, "  ID\tSTATE\tHOST\tPID\tVERSION\tSTARTED\tLAST BEAT\tCONFIG SEQ\tLAG\tFIRES/S SHOWN\tHTTP\tREADY")
		for _, x := range replicas {
			lag := "-"
			if configSeq >= x.ConfigSeq {
				lag = fmt.Sprint(configSeq - x.ConfigSeq)
			}
			shown := "unknown"
			if x.FireCapacity > 0 {
				shown = forecast.Thousands(int64(x.FireCapacity))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s ago\t%d\t%s\t%s\t%s\t%s\n", terminalSafe(x.ID), x.State, terminalSafe(x.Host), x.PID, terminalSafe(dash(x.Version)), fmtTime(x.Started), x.BeatAge, x.ConfigSeq, lag, shown, terminalSafe(dash(x.HTTP)), terminalSafe(x.Ready))
		}
		tw.Flush()
	}
	if live == 0 {
		fmt.Fprintln(w, "  no live replica: no entry fires and no task is recovered until one runs (cronstream run)")
	}
}

// printEntries prints the Entries section: the counts, then the
// quarantined, failure-paused and completed entries by name.
func printEntries(w io.Writer, e entryCounts) {
	fmt.Fprintf(w, "\nEntries: %d active, %d paused, %d ended, %d completed, %d quarantined\n", e.Active, e.Paused, e.Ended, e.Completed, e.Quarantined)
	for _, q := range e.Bad {
		fmt.Fprintf(w, "  quarantined %s at revision %d (%s): %s\n", terminalSafe(q.ID), q.Revision, fmtTime(q.Time), terminalSafe(q.Reason))
	}
	for _, q := range e.FailurePaused {
		fmt.Fprintf(w, "  paused %s at revision %d (%s): %s\n", terminalSafe(q.ID), q.Revision, fmtTime(q.Time), terminalSafe(q.Reason))
	}
	for _, id := range e.CompletedIDs {
		if slices.Contains(e.CountUnknown, id) {
			fmt.Fprintf(w, "  completed %s: %s\n", terminalSafe(id), maxFiresUnknownReason)
			continue
		}
		fmt.Fprintf(w, "  completed %s: fired its max_fires, fires nothing more\n", terminalSafe(id))
	}
}

// printStreams prints the Streams section.
func printStreams(w io.Writer, streams ...streamPosition) {
	fmt.Fprintln(w, "\nStreams:")
	for _, p := range streams {
		last := "-"
		if p.LastTime != nil {
			last = fmtTime(*p.LastTime)
		}
		fmt.Fprintf(w, "  %-24s last seq %d at %s, %d messages\n", p.Stream, p.LastSeq, last, p.Messages)
	}
}

// printOutbox prints the relay's backlog into activityStream.
func printOutbox(w io.Writer, o outboxStatus, activityStream string) {
	backlog := "unknown (see below)"
	if o.Backlog != nil {
		backlog = fmt.Sprint(*o.Backlog)
	}
	fmt.Fprintf(w, "\nOutbox backlog (in Redis, not yet in %s): %s\n", activityStream, backlog)
}

// printQueues prints the Queues section, and the ticks overlap
// buffer-one holds or dropped in each; queuesErr says they are unknown.
func printQueues(w io.Writer, queues []queueStatus, queuesErr string) {
	fmt.Fprintln(w, "\nQueues:")
	switch {
	case queuesErr != "":
		fmt.Fprintln(w, "  unknown (see below)")
		return
	case len(queues) == 0:
		fmt.Fprintln(w, "  none yet")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "  QUEUE\tPENDING\tACTIVE\tSCHEDULED\tRETRY\tARCHIVED\tPROCESSED\tFAILED\tTODAY OK/FAILED\tOUTBOX\tPAUSED")
	for _, q := range queues {
		paused := "-"
		if q.Paused {
			paused = "yes"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%s\n", terminalSafe(q.Queue), q.Pending, q.Active, q.Scheduled,
			q.Retry, q.Archived, q.Processed, q.Failed, q.ProcessedToday-q.FailedToday, q.FailedToday, q.Outbox, paused)
	}
	tw.Flush()
	for _, q := range queues {
		if q.Held > 0 || q.HeldDropped > 0 {
			fmt.Fprintf(w, "  %s: %d held tick(s) waiting (overlap buffer-one), %d dropped unfired (skipped: overlap-dropped)\n",
				terminalSafe(q.Queue), q.Held, q.HeldDropped)
		}
	}
}

// printNextFires prints the Next fires section, each with how long until
// it on this host's clock.
func printNextFires(w io.Writer, fires []nextFireView) {
	fmt.Fprintln(w, "\nNext fires:")
	if len(fires) == 0 {
		fmt.Fprintln(w, "  none")
		return
	}
	tw := newTable(w)
	for _, f := range fires {
		fmt.Fprintf(tw, "  %s\t(in %s)\t%s\tqueue %s\n", fmtTime(f.Time), time.Until(f.Time).Round(time.Second), terminalSafe(f.Entry), terminalSafe(f.Queue))
	}
	tw.Flush()
}

// printLate prints the Late section: the entries whose tick is overdue
// for longer than lateAfter, with the reason a replica reports.
func printLate(w io.Writer, late []stall.Late, lateAfter string) {
	fmt.Fprintf(w, "\nLate (tick overdue for more than %s): %d\n", lateAfter, len(late))
	if len(late) == 0 {
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "  ENTRY\tQUEUE\tTICK\tOVERDUE\tREASON")
	for _, l := range late {
		why := "no failure reported by a replica"
		if l.Reason != "" {
			why = printable(l.Reason)
			if l.Replica != "" {
				why += " (" + printable(l.Replica) + ")"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(l.Entry), printable(l.Queue), fmtTime(l.Tick),
			(time.Duration(l.OverdueSeconds) * time.Second).String(), why)
	}
	tw.Flush()
}

// printWarnings prints the Warnings section, when there are any.
func printWarnings(w io.Writer, warnings []string) {
	if len(warnings) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWarnings:")
	for _, x := range warnings {
		fmt.Fprintf(w, "  ! %s\n", terminalSafe(x))
	}
}

// printNotes prints the Note section: always, for the recoverer's note.
func printNotes(w io.Writer, notes []string) {
	fmt.Fprintln(w, "\nNote:")
	for _, x := range notes {
		fmt.Fprintf(w, "  %s\n", x)
	}
}

// printErrors prints what could not be read, when anything could not.
func printErrors(w io.Writer, errs []string) {
	if len(errs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nCould not read:")
	for _, x := range errs {
		fmt.Fprintf(w, "  %s\n", terminalSafe(x))
	}
}
