package projector

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

func validEntry(id string) events.Entry {
	return events.Entry{ID: id, Cron: "*/5 * * * *", Task: events.Task{Type: "t:" + id}}
}

func TestFoldRefusesBadEvents(t *testing.T) {
	t.Parallel()
	paused := validEntry("a")
	paused.Paused = true
	removed := validEntry("a")
	removed.Removed = true
	cases := []struct {
		name    string
		subject string
		data    func(t *testing.T) []byte
		entry   string // quarantined entry; "" = ignored
		reason  string
	}{
		{"garbage", "pt.config.a", func(*testing.T) []byte { return []byte{0xff, 0x00, '{'} }, "a", "malformed event"},
		{"unknown type", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, "cronstream.entry.frozen", "a", validEntry("a")) }, "a", "unknown config event type"},
		{"activity type on config subject", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryFired, "a", validEntry("a")) }, "a", "unknown config event type"},
		{"no data", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", nil) }, "a", "data"},
		{"data not an entry", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", []int{1}) }, "a", "data"},
		{"bad cron", "pt.config.a", func(t *testing.T) []byte {
			e := validEntry("a")
			e.Cron = "every tuesday"
			return rawEvent(t, events.TypeEntryUpdated, "a", e)
		}, "a", "cron"},
		{"enum from a newer version", "pt.config.a", func(t *testing.T) []byte {
			e := validEntry("a")
			e.Catchup.Policy = "smart"
			return rawEvent(t, events.TypeEntryUpdated, "a", e)
		}, "a", "catchup.policy"},
		{"data.id mismatch", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", validEntry("b")) }, "a", "does not match"},
		{"event subject mismatch", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "b", validEntry("a")) }, "a", "does not match"},
		{"paused without paused", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryPaused, "a", validEntry("a")) }, "a", "paused=false"},
		{"resumed still paused", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryResumed, "a", paused) }, "a", "paused=true"},
		{"removed without removed", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryRemoved, "a", validEntry("a")) }, "a", "removed=true"},
		{"updated with removed", "pt.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", removed) }, "a", "removed=true"},
		{"subject with two tokens", "pt.config.a.b", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", validEntry("a")) }, "", "no valid entry id"},
		{"wildcard subject token", "pt.config.*", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", validEntry("a")) }, "", "no valid entry id"},
		{"invalid UTF-8 in the queue", "pt.config.a", func(t *testing.T) []byte {
			e := validEntry("a")
			e.Options.Queue = "q\x01"
			return bytes.Replace(rawEvent(t, events.TypeEntryUpdated, "a", e), []byte(`q\u0001`), []byte("q\xff"), 1)
		}, "a", `options.queue "q\xff": must be valid UTF-8`},
		{"half a surrogate pair in the task type", "pt.config.a", func(t *testing.T) []byte {
			e := validEntry("a")
			e.Task.Type = "t\x01"
			return bytes.Replace(rawEvent(t, events.TypeEntryUpdated, "a", e), []byte(`t\u0001`), []byte(`t\ud800`), 1)
		}, "a", "task.type"},
		{"other prefix", "other.config.a", func(t *testing.T) []byte { return rawEvent(t, events.TypeEntryUpdated, "a", validEntry("a")) }, "", "no valid entry id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFold(testNames)
			if _, _, err := f.Apply("pt.config.a", 1, time.Now(), rawEvent(t, events.TypeEntryRegistered, "a", validEntry("a"))); err != nil {
				t.Fatalf("register: %v", err)
			}
			ch, changed, err := f.Apply(tc.subject, 2, time.Now(), tc.data(t))
			var bad *BadEventError
			if !errors.As(err, &bad) || !errors.Is(err, ErrBadEvent) {
				t.Fatalf("err %v, want a *BadEventError", err)
			}
			if bad.Seq != 2 || bad.Entry != tc.entry || !strings.Contains(bad.Reason, tc.reason) {
				t.Fatalf("bad event %+v, want seq 2, entry %q, reason containing %q", bad, tc.entry, tc.reason)
			}
			st := f.Stats()
			if tc.entry == "" {
				// Ignored: nothing changes, the entry keeps firing.
				if changed || st.Ignored != 1 || st.Bad != 0 || f.Len() != 1 {
					t.Fatalf("ignored message changed the fold: changed %v, stats %+v", changed, st)
				}
				return
			}
			if !changed || ch.New != nil || ch.Old == nil || !ch.Quarantined || ch.Seq != 2 {
				t.Fatalf("change %+v, want the entry taken out as quarantined", ch)
			}
			if _, ok := f.Get("a"); ok {
				t.Fatal("quarantined entry still in the map")
			}
			if q := f.Quarantined(); len(q) != 1 || q[0].ID != "a" || q[0].Seq != 2 || st.Bad != 1 {
				t.Fatalf("quarantined %+v, stats %+v", q, st)
			}
			// A valid event brings it back.
			ch, changed, err = f.Apply("pt.config.a", 3, time.Now(), rawEvent(t, events.TypeEntryUpdated, "a", validEntry("a")))
			if err != nil || !changed || ch.Old != nil || ch.New == nil || ch.New.Revision != 3 {
				t.Fatalf("recovery: change %+v, changed %v, err %v", ch, changed, err)
			}
			if len(f.Quarantined()) != 0 {
				t.Fatalf("still quarantined: %+v", f.Quarantined())
			}
		})
	}
}

// TestFoldQuarantinesInvalidIDs: events on a subject whose token is no
// valid entry id (another publisher's) quarantine what the token names, as
// `entry ls` lists it, without touching other entries; a removal naming it
// clears it, since no event can register it.
func TestFoldQuarantinesInvalidIDs(t *testing.T) {
	t.Parallel()
	f := NewFold(testNames)
	if _, _, err := f.Apply("pt.config.a", 1, time.Now(), rawEvent(t, events.TypeEntryRegistered, "a", validEntry("a"))); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 129)
	for i, c := range []struct {
		token string
		data  events.Entry
		want  string
	}{
		{"a~b", validEntry("a~b"), "id"},
		{"a~b", validEntry("a"), "does not match"},
		{long, validEntry(long), "id"},
	} {
		seq := uint64(i + 2)
		ch, changed, err := f.Apply("pt.config."+c.token, seq, time.Now(), rawEvent(t, events.TypeEntryUpdated, c.data.ID, c.data))
		var bad *BadEventError
		if !errors.As(err, &bad) || bad.Entry != c.token || !strings.Contains(bad.Reason, c.want) {
			t.Fatalf("%s: err %v, want the entry quarantined for %q", c.token, err, c.want)
		}
		if changed || ch.New != nil {
			t.Fatalf("%s: change %+v for an entry never registered", c.token, ch)
		}
	}
	if q := f.Quarantined(); len(q) != 2 || q[0].ID != "a~b" || q[0].Seq != 3 || q[1].ID != long {
		t.Fatalf("quarantined %+v", q)
	}
	if _, ok := f.Get("a"); !ok || f.Len() != 1 {
		t.Fatal("entry a must keep its state")
	}
	for i, id := range []string{"a~b", long} {
		rm := events.Entry{ID: id, Removed: true}
		if _, changed, err := f.Apply("pt.config."+id, uint64(10+i), time.Now(), rawEvent(t, events.TypeEntryRemoved, id, rm)); err != nil || changed {
			t.Fatalf("removal of %s: changed %v, %v", id, changed, err)
		}
	}
	if q, rm := f.Quarantined(), f.removals(); len(q) != 0 || len(rm) != 0 {
		t.Fatalf("after the removals: quarantined %+v, removals %+v", q, rm)
	}
	if st := f.Stats(); st.Bad != 3 || st.Ignored != 0 || st.Quarantined != 0 || st.Entries != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFoldAppliesByType(t *testing.T) {
	t.Parallel()
	f := NewFold(testNames)
	apply := func(seq uint64, typ string, e events.Entry) Change {
		t.Helper()
		ch, _, err := f.Apply(testNames.ConfigSubject(e.ID), seq, time.Unix(int64(seq), 0), rawEvent(t, typ, e.ID, e))
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		return ch
	}
	e := validEntry("a")
	if ch := apply(1, events.TypeEntryRegistered, e); ch.Old != nil || ch.New.Revision != 1 || ch.New.Entry.Options.QueueName() != "default" {
		t.Fatalf("registered: %+v", ch)
	}
	got, _ := f.Get("a")
	if got.Entry.Timezone != "UTC" || got.Entry.Options.Retries() != 25 || !got.Time.Equal(time.Unix(1, 0)) {
		t.Fatalf("state not normalized or time wrong: %+v", got)
	}
	e.Paused = true
	if ch := apply(2, events.TypeEntryPaused, e); ch.Old.Revision != 1 || !ch.New.Entry.Paused {
		t.Fatalf("paused: %+v", ch)
	}
	if got, ok := f.Get("a"); !ok || !got.Entry.Paused {
		t.Fatal("a paused entry must stay in the map, marked paused")
	}
	e.Paused = false
	apply(3, events.TypeEntryResumed, e)
	e.Removed = true
	if ch := apply(4, events.TypeEntryRemoved, e); ch.New != nil || ch.Old.Revision != 3 || ch.Quarantined || !ch.Time.Equal(time.Unix(4, 0)) {
		t.Fatalf("removed: %+v", ch)
	}
	if f.Len() != 0 {
		t.Fatal("removed entry still in the map")
	}
	if rm := f.removals(); len(rm) != 1 || rm[0].ID != "a" || rm[0].Seq != 4 || rm[0].Old.Entry.Cron != e.Cron || !rm[0].Time.Equal(time.Unix(4, 0)) {
		t.Fatalf("removals %+v, want a's at seq 4 with its last state", rm)
	}
	// Duplicates and stale messages are skipped without an error.
	if _, changed, err := f.Apply("pt.config.a", 2, time.Now(), []byte("garbage")); changed || err != nil || f.Stats().Duplicates != 1 {
		t.Fatalf("duplicate: changed %v err %v stats %+v", changed, err, f.Stats())
	}
	e.Removed = false
	if ch := apply(5, events.TypeEntryRegistered, e); ch.Old != nil || ch.New.Revision != 5 {
		t.Fatalf("re-registered: %+v", ch)
	}
	if rm := f.removals(); len(rm) != 0 {
		t.Fatalf("a registered again is still among the removals: %+v", rm)
	}
	if st := f.Stats(); st.Applied != 5 || st.LastSeq != 5 || st.Entries != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFoldMaxFiresSince: the count of a fire limit starts at the revision
// where max_fires last changed value; re-sending the same limit, or changing
// other fields, keeps it.
func TestFoldMaxFiresSince(t *testing.T) {
	t.Parallel()
	f := NewFold(testNames)
	e := validEntry("a")
	e.MaxFires = 3
	typ := events.TypeEntryRegistered + events.GatedSuffix
	steps := []struct {
		edit func(*events.Entry)
		want uint64
	}{
		{func(*events.Entry) {}, 1},
		{func(*events.Entry) {}, 1},                                       // same state again
		{func(e *events.Entry) { e.Note = "x"; e.Cron = "* * * * *" }, 1}, // another field
		{func(e *events.Entry) { e.MaxFires = 4 }, 4},                     // the limit changed
		{func(e *events.Entry) { e.MaxFires = 0 }, 0},                     // no limit
		{func(e *events.Entry) { e.MaxFires = 4 }, 6},                     // a limit again
	}
	for i, st := range steps {
		st.edit(&e)
		seq := uint64(i + 1)
		if _, _, err := f.Apply("pt.config.a", seq, time.Now(), rawEvent(t, typ, "a", e)); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		typ = events.TypeEntryUpdated + events.GatedSuffix
		if got, _ := f.Get("a"); got.MaxFiresSince != st.want {
			t.Errorf("step %d: max_fires since %d, want %d", i, got.MaxFiresSince, st.want)
		}
	}
}

// TestDiffNamesRemovals: a reload's difference gives an entry the new fold
// holds removed its removal event's sequence and time; one that vanished
// without a removal (a recreated stream) has no time.
func TestDiffNamesRemovals(t *testing.T) {
	t.Parallel()
	from, to := NewFold(testNames), NewFold(testNames)
	apply := func(f *Fold, seq uint64, typ string, e events.Entry) {
		t.Helper()
		if _, _, err := f.Apply(testNames.ConfigSubject(e.ID), seq, time.Unix(int64(seq), 0), rawEvent(t, typ, e.ID, e)); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	apply(from, 1, events.TypeEntryRegistered, validEntry("gone"))
	apply(from, 2, events.TypeEntryRegistered, validEntry("vanished"))
	apply(to, 1, events.TypeEntryRegistered, validEntry("gone"))
	rm := validEntry("gone")
	rm.Removed = true
	apply(to, 3, events.TypeEntryRemoved, rm)
	apply(to, 4, events.TypeEntryRegistered, validEntry("other"))
	got := map[string]Change{}
	for _, c := range diff(from, to) {
		got[c.ID] = c
	}
	if c := got["gone"]; c.New != nil || c.Seq != 3 || !c.Time.Equal(time.Unix(3, 0)) {
		t.Errorf("gone: %+v, want its removal at seq 3", c)
	}
	if c := got["vanished"]; c.New != nil || !c.Time.IsZero() {
		t.Errorf("vanished: %+v, want a removal without a time", c)
	}
}
