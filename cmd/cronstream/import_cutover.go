package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/asynqimport"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// runCutover is `import asynq --cutover`: watch the asynq schedulers stop,
// register each entry from the second after its last enqueue, and backfill
// the ticks between that and its registration.
//
// Why a backfill: a registered entry never fires a tick from before its
// registration (its floor), whatever its start_at, and the entries can
// only be registered once asynq has stopped (or both would fire). The
// ticks in between are fired by the same manual fire `entry backfill`
// uses, each under its tick's task id, so they cannot meet the replicas'
// fires (those are after the registration) or each other twice.
func runCutover(cmd *cobra.Command, g *globalFlags, f *importFlags, store *taskstate.Store, r asynqimport.Result) error {
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	s, err := openSession(g, &f.conn)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.ensureStreams(ctx); err != nil {
		return err
	}
	if err := asynqimport.CheckCutover(r); err != nil {
		return err
	}
	if err := refuseExisting(ctx, s, r); err != nil {
		return err
	}
	if err := requireReplicas(ctx, s); err != nil {
		return err
	}
	for _, e := range r.Entries {
		reportWarnings(stderr, e)
	}
	say := func(msg string) { fmt.Fprintf(stderr, "cutover: %s\n", terminalSafe(msg)) }
	hs, err := asynqimport.Cutover{Store: store, Settle: f.settle, Say: say}.Run(ctx, r)
	if err != nil {
		return fmt.Errorf("%w; nothing was registered, and the asynq schedulers' history is as it was", err)
	}
	entries := make([]events.Entry, 0, len(hs))
	for _, h := range hs {
		if h.StartAt.IsZero() {
			// asynq listed no next run: the spec has no tick to come.
			fmt.Fprintf(stderr, "warning: entry %s left out: asynq neither enqueued it nor listed a next run for it\n", h.Entry.Entry.ID)
			continue
		}
		for _, w := range h.Risks {
			fmt.Fprintf(stderr, "warning: entry %s: %s\n", h.Entry.Entry.ID, terminalSafe(w))
		}
		e := h.Entry.Entry.Clone()
		e.StartAt = h.StartAt
		entries = append(entries, e)
	}
	// The file first: whatever fails next, it says what the cutover decided.
	if err := writeImport(cmd, f.out, header(g, r, true), entries); err != nil {
		return err
	}
	if err := registerHandovers(ctx, s, f.owner, entries); err != nil {
		return fmt.Errorf("%w\nthe asynq schedulers are stopped: register the entries with `cronstream sync -f` of the file written, then backfill each from its start_at to its registration (`cronstream entry backfill`)", err)
	}
	fired, err := backfillHandovers(ctx, s, store, entries)
	printHandovers(cmd.OutOrStdout(), stderr, f.out, hs, fired)
	return err
}

// refuseExisting fails when an entry to hand over is already registered:
// it would be firing beside asynq now, and its floor is not the cutover's.
func refuseExisting(ctx context.Context, s *session, r asynqimport.Result) error {
	cur, err := s.client.List(ctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, c := range cur {
		live[c.ID] = true
	}
	var dup []string
	for _, e := range r.Entries {
		if live[e.Entry.ID] {
			dup = append(dup, e.Entry.ID)
		}
	}
	if len(dup) > 0 {
		return fmt.Errorf("already registered in cronstream: %s; a cutover registers entries that asynq alone fires until then (remove them, or import without --cutover)", strings.Join(dup, ", "))
	}
	return nil
}

// requireReplicas fails when no cronstream replica runs: the entries
// would not fire after the cutover, and a tick missed then follows the
// catch-up policy (none: skipped), not the cutover.
func requireReplicas(ctx context.Context, s *session) error {
	infos, err := replica.ListReplicas(ctx, s.js, s.names)
	if err != nil && !errors.Is(err, replica.ErrNoReplicasBucket) {
		return fmt.Errorf("read the live replicas: %w", err)
	}
	now := time.Now()
	infos = slices.DeleteFunc(infos, func(i replica.Info) bool { return now.Sub(i.Beat) > i.StaleAfter() })
	if len(infos) == 0 {
		return fmt.Errorf("no cronstream replica runs with prefix %q: start the replicas (cronstream run) before the cutover, or the entries would not fire once asynq stops", s.names.Prefix())
	}
	return nil
}

// registerHandovers publishes the entries through configsync's plan, as
// sync -f of the written file would.
func registerHandovers(ctx context.Context, s *session, owner string, entries []events.Entry) error {
	cfgs := make([]configsync.Config, 0, len(entries))
	for _, e := range entries {
		cfgs = append(cfgs, configsync.Config{Entry: e})
	}
	if err := configsync.Validate(cfgs); err != nil {
		return err
	}
	cur, err := s.client.List(ctx)
	if err != nil {
		return err
	}
	_, err = configsync.Apply(ctx, s.client, configsync.MakePlan(cur, cfgs, owner, false))
	return err
}

// registrationWait bounds how long a backfill waits for the Redis clock to
// reach an entry's registration (the NATS server's clock stamped it).
const registrationWait = time.Minute

// backfillHandovers fires, per entry, the ticks from its start_at to its
// registration. It returns the task ids fired per entry.
func backfillHandovers(ctx context.Context, s *session, store *taskstate.Store, entries []events.Entry) (map[string][]string, error) {
	now, err := storeTime(ctx, store)
	if err != nil {
		return nil, err
	}
	m := scheduler.Manual{Redis: store.Client(), JS: s.js, Names: s.names, Source: s.source, Now: now}
	fired := map[string][]string{}
	var errs []error
	for _, e := range entries {
		registered, err := registeredAt(ctx, s, e.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if registered.Before(e.StartAt) {
			continue // nothing fell between
		}
		// No tick may fire before its time on the replicas' clock.
		for now().Before(registered) {
			if now().Add(registrationWait).Before(registered) {
				errs = append(errs, fmt.Errorf("entry %s: registered at %s, more than %s ahead of Redis's clock: backfill it later", e.ID, fmtTime(registered), registrationWait))
				break
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return fired, err
			}
		}
		t, err := m.Load(ctx, e.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res, err := m.Backfill(ctx, t, e.StartAt, registered)
		fired[e.ID] = res.Fired
		if err != nil {
			errs = append(errs, fmt.Errorf("%w (backfill it: cronstream entry backfill %s --from %s --to %s)", err, e.ID, fmtTime(e.StartAt), fmtTime(registered)))
		}
	}
	return fired, errors.Join(errs...)
}

// registeredAt is when the stream stored entry's last registration: its
// floor on every replica.
func registeredAt(ctx context.Context, s *session, id string) (time.Time, error) {
	recs, err := s.client.History(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	var at time.Time
	for _, rec := range recs {
		if rec.Event != nil && events.ConfigKind(rec.Event.Type) == events.TypeEntryRegistered {
			at = rec.Time
		}
	}
	if at.IsZero() {
		return at, fmt.Errorf("entry %s: no registration in its history", id)
	}
	return at, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// printHandovers prints what the cutover did, one line per entry: to
// stdout when the file went elsewhere, else to stderr.
func printHandovers(stdout, stderr io.Writer, out string, hs []asynqimport.Handover, fired map[string][]string) {
	w := stdout
	if out == "" || out == "-" {
		w = stderr
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ENTRY\tLAST ASYNQ ENQUEUE\tSTART_AT\tFROM\tBACKFILLED")
	for _, h := range hs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", h.Entry.Entry.ID, fmtTime(h.LastEnqueue), fmtTime(h.StartAt), h.Basis, len(fired[h.Entry.Entry.ID]))
	}
	_ = tw.Flush()
}
