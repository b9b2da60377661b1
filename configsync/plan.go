package configsync

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/cronstream/cronstream/events"
)

// DefaultOwner is the owner label sync writes when none is given.
const DefaultOwner = "sync"

// ActionKind says what an Action does to an entry.
type ActionKind string

// Action kinds, with the sign `sync --dry-run` prints for each.
const (
	Create ActionKind = "create" // +
	Update ActionKind = "update" // ~
	Remove ActionKind = "remove" // -
)

// Sign is the one-character mark of the kind in a printed plan.
func (k ActionKind) Sign() string {
	switch k {
	case Create:
		return "+"
	case Update:
		return "~"
	case Remove:
		return "-"
	}
	return "?"
}

// Action is one config event a plan will publish.
type Action struct {
	Kind ActionKind
	ID   string
	// Revision is the entry's revision the plan was made from (0: no live
	// entry); the write is conditional on it.
	Revision uint64
	// Entry is the state to write (for Remove: the current state).
	Entry events.Entry
	// Changes lists the fields an Update changes, and a Create sets.
	Changes []FieldChange
	// Repair says the entry's current last event cannot be applied
	// (the entry is quarantined); the update replaces it.
	Repair bool
}

// Plan is the difference between the current entries and the wanted ones.
type Plan struct {
	// Actions, sorted by entry id.
	Actions []Action
	// Unchanged are the wanted entries that already are as wanted.
	Unchanged []string
	// NotPruned are entries of this owner that the configs no longer list,
	// left in place because pruning is off.
	NotPruned []string
}

// Empty reports whether the plan publishes nothing.
func (p Plan) Empty() bool { return len(p.Actions) == 0 }

// Count returns how many actions of kind the plan has.
func (p Plan) Count(kind ActionKind) int {
	n := 0
	for _, a := range p.Actions {
		if a.Kind == kind {
			n++
		}
	}
	return n
}

// MakePlan computes what to publish so that the entries of current (as
// events.Client.List returns them) become desired, which must have passed
// Validate. Every desired entry gets owner. With prune, live entries whose
// owner is owner and that desired does not list are removed; entries with
// another owner or none, and entries whose state cannot be read, are never
// removed. An entry's pause state changes only when its Config says Paused.
func MakePlan(current []events.Current, desired []Config, owner string, prune bool) Plan {
	var p Plan
	cur := make(map[string]events.Current, len(current))
	for _, c := range current {
		cur[c.ID] = c
	}
	wanted := make(map[string]bool, len(desired))
	for _, d := range desired {
		id := d.Entry.ID
		wanted[id] = true
		c, exists := cur[id]
		next := d.Entry.Clone()
		next.Owner, next.Removed = owner, false
		if d.Owner != nil {
			next.Owner = *d.Owner
		}
		switch {
		case d.Paused != nil:
			next.Paused = *d.Paused
		case exists && c.Err == nil:
			next.Paused = c.Entry.Paused
			if c.Entry.Paused && next.Note == "" {
				// The operator's reason for the pause stays with it.
				next.Note = c.Entry.Note
			}
		default:
			next.Paused = false
		}
		next = next.Normalize()
		switch {
		case !exists:
			p.Actions = append(p.Actions, Action{Kind: Create, ID: id, Entry: next, Changes: Diff(events.Entry{}, next)})
		case c.Err != nil:
			p.Actions = append(p.Actions, Action{Kind: Update, ID: id, Revision: c.Revision, Entry: next, Changes: Diff(events.Entry{}, next), Repair: true})
		case events.SameContent(c.Entry, next):
			p.Unchanged = append(p.Unchanged, id)
		default:
			p.Actions = append(p.Actions, Action{Kind: Update, ID: id, Revision: c.Revision, Entry: next, Changes: Diff(c.Entry, next)})
		}
	}
	for _, c := range current {
		if wanted[c.ID] || c.Err != nil || owner == "" || c.Entry.Owner != owner {
			continue
		}
		if prune {
			p.Actions = append(p.Actions, Action{Kind: Remove, ID: c.ID, Revision: c.Revision, Entry: c.Entry})
		} else {
			p.NotPruned = append(p.NotPruned, c.ID)
		}
	}
	slices.SortFunc(p.Actions, func(a, b Action) int { return strings.Compare(a.ID, b.ID) })
	sort.Strings(p.Unchanged)
	sort.Strings(p.NotPruned)
	return p
}

// Select narrows a sync to the entries a label selector picks: only the
// desired entries whose labels match are written, and only live entries
// that match (or that a selected desired entry updates) are considered,
// so --prune never removes an entry outside the selector. An empty
// selector selects everything.
func Select(current []events.Current, desired []Config, sel events.Selector) ([]events.Current, []Config) {
	if sel.Empty() {
		return current, desired
	}
	var ds []Config
	wanted := map[string]bool{}
	for _, d := range desired {
		if sel.Matches(d.Entry.Labels) {
			ds = append(ds, d)
			wanted[d.Entry.ID] = true
		}
	}
	var cs []events.Current
	for _, c := range current {
		if wanted[c.ID] || (c.Err == nil && sel.Matches(c.Entry.Labels)) {
			cs = append(cs, c)
		}
	}
	return cs, ds
}

// FieldChange is one field that differs between two states of an entry.
// Values are shown as people read them: strings unquoted, durations in Go
// syntax, payloads as text when they are text.
type FieldChange struct {
	Field string // JSON path, e.g. "options.queue" or "task.headers.source"
	Old   string // "" when the field was unset
	New   string // "" when the field is now unset
}

func (c FieldChange) String() string {
	switch {
	case c.Old == "":
		return fmt.Sprintf("%s: %s", c.Field, quoteIfNeeded(c.New))
	case c.New == "":
		return fmt.Sprintf("%s: %s → (unset)", c.Field, quoteIfNeeded(c.Old))
	}
	return fmt.Sprintf("%s: %s → %s", c.Field, quoteIfNeeded(c.Old), quoteIfNeeded(c.New))
}

// quoteIfNeeded leaves plain values bare and quotes the others so their
// ends show; JSON payloads read best in single quotes, as in a shell.
func quoteIfNeeded(s string) string {
	switch {
	case s == "" || strings.ContainsAny(s, "\t\n\r"):
		return fmt.Sprintf("%q", s)
	case !strings.ContainsAny(s, " \"'"):
		return s
	case !strings.Contains(s, "'"):
		return "'" + s + "'"
	}
	return fmt.Sprintf("%q", s)
}

// Diff lists the fields that differ between old and new after defaults
// are applied to both, sorted by field. Diff(events.Entry{}, e) lists
// every field e sets.
func Diff(old, new events.Entry) []FieldChange {
	a, b := flatten(old), flatten(new)
	if old.ID == "" && old.Cron == "" && old.Task.Type == "" {
		a = map[string]string{}
	}
	var out []FieldChange
	for k, v := range b {
		if a[k] != v {
			out = append(out, FieldChange{Field: k, Old: a[k], New: v})
		}
	}
	for k, v := range a {
		if _, ok := b[k]; !ok {
			out = append(out, FieldChange{Field: k, Old: v})
		}
	}
	slices.SortFunc(out, func(x, y FieldChange) int { return strings.Compare(fieldOrder(x.Field), fieldOrder(y.Field)) })
	return out
}

// fieldOrder sorts the fields people care about first.
func fieldOrder(f string) string {
	for i, p := range []string{"id", "cron", "timezone", "task.type", "task.payload", "task.headers", "options", "catchup", "overlap", "jitter", "pause_on_failure", "tick_headers", "paused", "note", "owner", "start_at", "end_at", "exclude", "labels"} {
		if f == p || strings.HasPrefix(f, p+".") {
			return fmt.Sprintf("%02d%s", i, f)
		}
	}
	return "99" + f
}

// flatten turns an entry into field path → displayed value.
func flatten(e events.Entry) map[string]string {
	out := map[string]string{}
	raw, err := json.Marshal(e.Normalize())
	if err != nil {
		return out
	}
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return out
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, vv := range x {
				walk(join(prefix, k), vv)
			}
		case nil:
		case string:
			out[prefix] = x
		default:
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		}
	}
	walk("", m)
	delete(out, "id")
	if len(e.Task.Payload) > 0 {
		out["task.payload"] = PayloadText(e.Task.Payload)
	}
	return out
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// PayloadText shows a payload as people read it: text as text (shortened),
// anything else by size. A digest tells apart payloads whose shown parts
// are equal.
func PayloadText(b []byte) string {
	sum := sha256.Sum256(b)
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes of binary, sha256 %x)", len(b), sum[:4])
	}
	const max = 80
	if utf8.RuneCount(b) > max {
		r := []rune(string(b))
		return string(r[:max]) + fmt.Sprintf("… (%d bytes, sha256 %x)", len(b), sum[:4])
	}
	return string(b)
}
