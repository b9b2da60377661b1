// Package asynqimport reads the periodic entries of a running asynq
// deployment from its Redis and turns them into cronstream entries: what
// `cronstream import asynq` writes as a schedules file, and the cutover
// that hands every entry over to cronstream after the last tick asynq
// enqueued. Conversion is internal/asynqconv's; Redis is read and written
// through internal/taskstate.
package asynqimport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/asynqconv"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// Source is one asynq registration an entry was made of.
type Source struct {
	Scheduler string // the asynq scheduler's id, <host>:<pid>:<uuid>
	EntryID   string // asynq's entry id (a UUID per registration)
	// Spec is the spec as registered.
	Spec string
	// Next and Prev are the entry's next and last enqueue as the scheduler
	// last listed them (Prev zero: none yet).
	Next, Prev time.Time
}

// Entry is one cronstream entry: identical registrations of any number of
// scheduler processes.
type Entry struct {
	Entry   events.Entry
	Sources []Source
	// Warnings say what the entry may lack or get wrong: what asynq does
	// not store, a spec asynq runs as another, a time zone that does not
	// fit the next run asynq listed.
	Warnings []string
	// ZoneMismatch: the next run a scheduler listed is not a tick of the
	// spec in the entry's time zone, so cronstream would fire it at other
	// instants. The cutover refuses such an entry.
	ZoneMismatch bool
}

// Problem is a registration that does not convert.
type Problem struct {
	Source Source
	Type   string
	Err    error
}

// Result is what Read found.
type Result struct {
	// Entries, sorted by id.
	Entries []Entry
	// Problems, in the order the schedulers list them.
	Problems []Problem
	// Schedulers are the running asynq schedulers read (their lists
	// exist), sorted.
	Schedulers []string
	// Own are cronstream's own scheduler lists, left out: cronstream
	// lists its entries for asynq's tools (docs/asynq-compat.md).
	Own []string
	// Stale are schedulers asynq:schedulers still names but whose list has
	// expired: stopped without clearing it (killed), not running.
	Stale []string
	// Undecodable counts list elements that are not SchedulerEntries.
	Undecodable int
}

// Options shape the entries.
type Options struct {
	// Timezone is every entry's zone: asynq keeps the scheduler's Location
	// nowhere in Redis ("" : UTC, asynq's default).
	Timezone string
}

// ErrNoSchedulers: no running asynq scheduler lists entries in Redis.
var ErrNoSchedulers = errors.New("no running asynq scheduler found")

// notStored is the warning every imported entry carries: what asynq's
// SchedulerEntry does not keep.
const notStored = "asynq does not store the task's headers (NewTaskWithHeaders) or the options given to asynq.NewTask (only those given to Register): add them if the registration had any"

// Read reads every running asynq scheduler's entries and merges identical
// registrations (the same spec, task and options, so the same derived id)
// into one entry each.
func Read(ctx context.Context, store *taskstate.Store, opts Options) (Result, error) {
	zone := opts.Timezone
	if zone == "" {
		zone = events.DefaultTimezone
	}
	loc, err := (events.Entry{Timezone: zone}).Location()
	if err != nil {
		return Result{}, fmt.Errorf("time zone: %w", err)
	}
	lists, err := store.ListSchedulers(ctx)
	if err != nil {
		return Result{}, err
	}
	var r Result
	byID := map[string]*Entry{}
	for _, l := range lists {
		switch {
		case taskstate.IsOwnSchedulerID(l.ID):
			r.Own = append(r.Own, l.ID)
			continue
		case !l.Exists:
			// The list's TTL is Redis's own (asynq's EXPIRE), so a list
			// that exists is a live scheduler's; the member's score is
			// the scheduler host's clock, which may be off.
			r.Stale = append(r.Stale, l.ID)
			continue
		}
		r.Schedulers = append(r.Schedulers, l.ID)
		r.Undecodable += len(l.Bad)
		for _, se := range l.Entries {
			src := Source{Scheduler: l.ID, EntryID: se.ID, Spec: se.Spec, Next: se.Next, Prev: se.Prev}
			e, warn, err := convert(se, zone)
			if err != nil {
				r.Problems = append(r.Problems, Problem{Source: src, Type: se.TaskType, Err: err})
				continue
			}
			imp := byID[e.ID]
			if imp == nil {
				imp = &Entry{Entry: e, Warnings: append(warn, notStored)}
				if opts.Timezone == "" && !isEvery(e.Cron) {
					imp.Warnings = append(imp.Warnings, "asynq does not store the scheduler's time zone (SchedulerOpts.Location): the spec is evaluated in UTC, asynq's default; if the scheduler set another, pass --timezone")
				}
				byID[e.ID] = imp
			}
			imp.Sources = append(imp.Sources, src)
			if w := zoneWarning(e, loc, se.Next); w != "" && !imp.ZoneMismatch {
				imp.ZoneMismatch = true
				imp.Warnings = append(imp.Warnings, w)
			}
		}
	}
	slices.Sort(r.Schedulers)
	for _, e := range byID {
		r.Entries = append(r.Entries, *e)
	}
	slices.SortFunc(r.Entries, func(a, b Entry) int { return strings.Compare(a.Entry.ID, b.Entry.ID) })
	if len(r.Schedulers) == 0 {
		return r, ErrNoSchedulers
	}
	return r, nil
}

// convert turns one listed registration into an entry in zone. A spec
// asynq runs as another (a fractional @every) is imported as asynq runs
// it, with a warning.
func convert(se taskstate.SchedulerEntry, zone string) (events.Entry, []string, error) {
	reg := asynqconv.Registration{Spec: se.Spec, Type: se.TaskType, Payload: se.TaskPayload, Options: se.EnqueueOptions}
	var warn []string
	e, err := reg.Entry()
	var spec *asynqconv.SpecError
	if errors.As(err, &spec) && len(asynqconv.OptionErrors(err)) == 0 {
		reg.Spec = spec.Runs
		warn = append(warn, fmt.Sprintf("registered as %q, which asynq runs as %q: imported as %q", spec.Spec, spec.Runs, spec.Runs))
		e, err = reg.Entry()
	}
	if err != nil {
		return events.Entry{}, nil, err
	}
	e.Timezone = zone
	if err := e.Validate(); err != nil {
		return events.Entry{}, nil, err
	}
	return e, warn, nil
}

func isEvery(spec string) bool { return strings.HasPrefix(spec, "@every ") }

// zoneWarning checks the next run a scheduler listed against the spec in
// loc: asynq computed it in its own Location, so a next run that is not a
// tick of the spec here means the scheduler ran in another zone. @every
// counts from registration in asynq and cannot be checked (nor depends on
// the zone); neither can an entry without a next run.
func zoneWarning(e events.Entry, loc *time.Location, next time.Time) string {
	if next.IsZero() || isEvery(e.Cron) {
		return ""
	}
	sched, err := events.ParseCron(e.Cron, loc)
	if err != nil {
		return ""
	}
	if got := sched.Next(next.Add(-time.Second)); got.Equal(next) {
		return ""
	}
	return fmt.Sprintf("asynq listed its next run at %s, which is not a tick of %q in %s: the scheduler runs in another time zone; pass --timezone with the zone of its SchedulerOpts.Location",
		next.UTC().Format(time.RFC3339), e.Cron, loc)
}
