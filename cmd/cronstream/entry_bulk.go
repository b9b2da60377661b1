package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

// bulkHelp is the part of pause's, resume's and rm's help about acting on
// several entries.
const bulkHelp = `Several entries are
shown first and asked about on a terminal ([y/N]); --yes goes ahead
without asking, --dry-run only shows. Without a terminal, more than
--max-changes (default 50) entries are refused unless --yes. Each entry is
written only if it is still at the revision shown: one changed meanwhile
is left alone and counted as conflicted. The summary says how many
changed, were unchanged, conflicted or were not found; the exit status is
4 when any conflicted, 3 when an id was not found.`

// bulkWrite is one of the writes that act on entries by id alone (pause,
// resume, rm), for one entry or many.
type bulkWrite struct {
	verb      string // pause, resume, remove
	done      string // paused, resumed, removed
	unchanged string // why an entry needs no change: "already paused"
	// needed says whether cur would change; nil: every entry would.
	needed func(cur events.Current) bool
	write  func(ctx context.Context, c *events.Client, id string, opts ...events.WriteOption) (events.Result, error)
}

// bulkFlags select the entries of a bulk write, as entry ls filters them,
// and hold its guard rails.
type bulkFlags struct {
	filter lsFilter
	guard  guardFlags
}

func (f *bulkFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	addSelector(cmd, &f.filter.selector, "every entry whose labels match this selector", "")
	fl.StringVar(&f.filter.typ, "type", "", "every entry whose task type matches this glob")
	fl.StringVar(&f.filter.queue, "queue", "", "every entry firing into this queue")
	fl.StringVar(&f.filter.owner, "owner", "", `every entry of this owner ("" : without one)`)
	f.guard.add(cmd)
}

// filtered reports whether a filter was given.
func (f *bulkFlags) filtered(cmd *cobra.Command) bool {
	for _, name := range []string{"selector", "type", "queue", "owner"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

// bulkArgs checks the ids of a bulk write before anything connects: any
// number of valid ids (rm: any id entry ls lists), or none with a filter.
func bulkArgs(listed bool) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		for _, id := range args {
			id = strings.TrimPrefix(id, namePrefix)
			check := events.ValidateID
			if listed {
				check = events.ValidateListedID
			}
			if err := check(id); err != nil {
				return usageError{err}
			}
		}
		return nil
	}
}

// namePrefix is what entry ls -o name puts before each id; the commands
// that take ids take them with it too.
const namePrefix = "entry/"

// eventNamePrefix is what -o name puts before each event id (audit, entry
// history): events are named apart from entries, as kubectl names kinds.
const eventNamePrefix = "event/"

// bulkResult is what a bulk write prints with --json.
type bulkResult struct {
	Changed    []writeResult `json:"changed"`
	Unchanged  []string      `json:"unchanged"`
	Conflicted []string      `json:"conflicted"`
	NotFound   []string      `json:"not_found"`
	Failed     []string      `json:"failed"`
}

// runBulkWrite runs w on the entries args and the filters name. One id
// without filters and without guard flags is the plain write it always
// was. Otherwise the entries are listed, those the write would change are
// shown and confirmed (guardFlags), and each is written conditionally on
// the revision shown: an entry changed since is counted as conflicted,
// never overwritten. The summary (and the exit status: 4 when any
// conflicted, 3 when any id was not found) says what became of each.
func runBulkWrite(cmd *cobra.Command, g *globalFlags, conn *connFlags, rev *revisionFlag, f *bulkFlags, args []string, w bulkWrite) error {
	args = slices.Clone(args)
	for i, id := range args {
		args[i] = strings.TrimPrefix(id, namePrefix) // as entry ls -o name prints them
	}
	filtered := f.filtered(cmd)
	switch {
	case len(args) == 0 && !filtered:
		return usagef("give entry ids, or select entries with --selector, --type, --queue or --owner")
	case len(args) > 0 && filtered:
		return usagef("give entry ids or filters, not both: ids name the entries exactly")
	case cmd.Flags().Changed("if-revision") && (len(args) != 1 || filtered):
		return usagef("--if-revision applies to one entry; a bulk %s is conditional on the revisions it shows", w.verb)
	}
	if err := f.filter.check(cmd); err != nil {
		return err
	}
	guarded := cmd.Flags().Changed("dry-run") || cmd.Flags().Changed("yes")
	if len(args) == 1 && !filtered && !guarded {
		return runEntryWrite(cmd, g, conn, args[0], w.done, "entry %s was "+w.unchanged+" (revision %d)\n",
			func(ctx context.Context, c *events.Client) (events.Result, error) {
				return w.write(ctx, c, args[0], rev.opts(cmd)...)
			})
	}
	ctx := cmd.Context()
	s, err := openStreamsSession(ctx, g, conn)
	if err != nil {
		return err
	}
	defer s.Close()
	cur, err := s.client.List(ctx)
	if err != nil {
		return err
	}
	var out bulkResult
	targets := bulkTargets(cur, args, &f.filter, &out)
	var todo []events.Current
	for _, c := range targets {
		switch {
		case c.Err != nil && w.needed != nil:
			out.Failed = append(out.Failed, fmt.Sprintf("%s: its state cannot be read (%v); only rm acts on it", c.ID, c.Err))
		case w.needed != nil && !w.needed(c):
			out.Unchanged = append(out.Unchanged, c.ID)
		default:
			todo = append(todo, c)
		}
	}
	if f.guard.dryRun && g.json {
		plan := bulkPlan{Would: []writeResult{}, Unchanged: nonNil(out.Unchanged), NotFound: nonNil(out.NotFound), Failed: nonNil(out.Failed)}
		for _, c := range todo {
			plan.Would = append(plan.Would, writeResult{ID: c.ID, Result: w.done, Revision: c.Revision})
		}
		return printJSON(cmd.OutOrStdout(), plan)
	}
	ok, err := f.guard.confirm(cmd, w.verb, len(todo), "entry", "entries", func(pw io.Writer) {
		fmt.Fprintf(pw, "%s %s:\n", capitalize(w.verb), plural(len(todo), "entry", "entries"))
		for i, c := range todo {
			if i == maxPreview {
				fmt.Fprintf(pw, "  … and %d more (--dry-run --json lists them all)\n", len(todo)-i)
				break
			}
			fmt.Fprintf(pw, "  %s (revision %d)\n", terminalSafe(c.ID), c.Revision)
		}
		if len(out.Unchanged) > 0 {
			fmt.Fprintf(pw, "%s %s: %s\n", plural(len(out.Unchanged), "entry is", "entries are"), w.unchanged, terminalSafe(summarize(out.Unchanged, 5)))
		}
	})
	if err != nil {
		return err
	}
	if ok {
		bulkApply(ctx, s.client, todo, w, &out)
	}
	return printBulkResult(cmd, g, w, &out, ok)
}

// bulkPlan is what a bulk write prints with --dry-run --json: each entry
// it would change at the revision it would be conditional on.
type bulkPlan struct {
	Would     []writeResult `json:"would_change"`
	Unchanged []string      `json:"unchanged"`
	NotFound  []string      `json:"not_found"`
	Failed    []string      `json:"failed"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// maxPreview bounds the entries a preview names one by one.
const maxPreview = 20

// bulkTargets picks the entries of cur that args name (out.NotFound gets
// the others) or that the filter keeps, in id order.
func bulkTargets(cur []events.Current, args []string, flt *lsFilter, out *bulkResult) []events.Current {
	byID := make(map[string]events.Current, len(cur))
	for _, c := range cur {
		byID[c.ID] = c
	}
	var targets []events.Current
	if len(args) > 0 {
		for _, id := range slices.Compact(slices.Sorted(slices.Values(args))) {
			if c, ok := byID[id]; ok {
				targets = append(targets, c)
			} else {
				out.NotFound = append(out.NotFound, id)
			}
		}
		return targets
	}
	now := time.Now()
	for _, c := range cur {
		v := entryView{Entry: events.Entry{ID: c.ID}, State: stateQuarantined}
		if c.Err == nil {
			v = newEntryView(c.Entry, c.Revision, c.Time, now)
		}
		if flt.keep(v) {
			targets = append(targets, c)
		}
	}
	slices.SortFunc(targets, func(a, b events.Current) int { return strings.Compare(a.ID, b.ID) })
	return targets
}

// bulkParallel bounds the writes in flight at once.
const bulkParallel = 8

// bulkApply writes each entry of todo conditionally on its revision.
func bulkApply(ctx context.Context, c *events.Client, todo []events.Current, w bulkWrite, out *bulkResult) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan events.Current)
	for range min(bulkParallel, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cur := range next {
				res, err := w.write(ctx, c, cur.ID, events.IfRevision(cur.Revision))
				mu.Lock()
				switch {
				case err == nil && res.Type == "":
					out.Unchanged = append(out.Unchanged, cur.ID)
				case err == nil:
					out.Changed = append(out.Changed, writeResult{ID: cur.ID, Result: w.done, Revision: res.Revision})
				case errors.Is(err, events.ErrRevisionConflict) || errors.Is(err, events.ErrNotFound):
					out.Conflicted = append(out.Conflicted, cur.ID)
				default:
					out.Failed = append(out.Failed, fmt.Sprintf("%s: %v", cur.ID, err))
				}
				mu.Unlock()
			}
		}()
	}
	for _, cur := range todo {
		next <- cur
	}
	close(next)
	wg.Wait()
	slices.SortFunc(out.Changed, func(a, b writeResult) int { return strings.Compare(a.ID, b.ID) })
	for _, ids := range [][]string{out.Unchanged, out.Conflicted, out.Failed} {
		slices.Sort(ids)
	}
}

// printBulkResult prints the summary (applied: the writes were made) and
// returns the error that chooses the exit status.
func printBulkResult(cmd *cobra.Command, g *globalFlags, w bulkWrite, out *bulkResult, applied bool) error {
	var err error
	switch {
	case len(out.Failed) > 0:
		err = fmt.Errorf("%s failed for %s: %s", w.verb, plural(len(out.Failed), "entry", "entries"), summarize(out.Failed, 3))
	case len(out.Conflicted) > 0:
		err = fmt.Errorf("%w: %s changed since they were read, left as they are: %s", events.ErrRevisionConflict,
			plural(len(out.Conflicted), "entry", "entries"), summarize(out.Conflicted, 10))
	case len(out.NotFound) > 0:
		err = fmt.Errorf("%w: %s", events.ErrNotFound, summarize(out.NotFound, 10))
	}
	if g.json {
		for _, l := range []*[]string{&out.Unchanged, &out.Conflicted, &out.NotFound, &out.Failed} {
			*l = nonNil(*l)
		}
		if out.Changed == nil {
			out.Changed = []writeResult{}
		}
		if perr := printJSON(cmd.OutOrStdout(), out); perr != nil {
			return perr
		}
		return err
	}
	if !applied {
		return err
	}
	ow := cmd.OutOrStdout()
	parts := []string{fmt.Sprintf("%s %s", w.done, plural(len(out.Changed), "entry", "entries"))}
	if n := len(out.Unchanged); n > 0 {
		parts = append(parts, fmt.Sprintf("%d unchanged (%s)", n, w.unchanged))
	}
	if n := len(out.Conflicted); n > 0 {
		parts = append(parts, fmt.Sprintf("%d conflicted", n))
	}
	if n := len(out.NotFound); n > 0 {
		parts = append(parts, fmt.Sprintf("%d not found", n))
	}
	if n := len(out.Failed); n > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", n))
	}
	fmt.Fprintln(ow, strings.Join(parts, ", "))
	return err
}
