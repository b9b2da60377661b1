package configsync

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cronstream/cronstream/events"
)

func entry(id, cron string) events.Entry {
	return events.Entry{ID: id, Cron: cron, Task: events.Task{Type: "t:" + id}}
}

func current(e events.Entry, rev uint64) events.Current {
	return events.Current{ID: e.ID, Revision: rev, Type: events.TypeEntryUpdated, Entry: e.Normalize()}
}

func owned(e events.Entry, owner string) events.Entry {
	e.Owner = owner
	return e
}

func boolp(b bool) *bool { return &b }

func kinds(p Plan) []string {
	var out []string
	for _, a := range p.Actions {
		out = append(out, a.Kind.Sign()+a.ID)
	}
	return out
}

func TestMakePlan(t *testing.T) {
	paused := owned(entry("p", "@daily"), "sync")
	paused.Paused, paused.Note = true, "by hand"
	cur := []events.Current{
		current(owned(entry("same", "@daily"), "sync"), 3),
		current(owned(entry("changed", "@daily"), "sync"), 4),
		current(owned(entry("gone", "@daily"), "sync"), 5),
		current(entry("manual", "@daily"), 6), // made with entry put: no owner
		current(owned(entry("other", "@daily"), "team2"), 7),
		current(paused, 8),
		{ID: "bad", Revision: 9, Err: errors.New("malformed")},
	}
	desired := []Config{
		{Entry: entry("same", "@daily")},
		{Entry: entry("changed", "@hourly")},
		{Entry: entry("new", "@daily")},
		{Entry: entry("p", "@daily")},
		{Entry: entry("bad", "@daily")},
	}
	t.Run("no prune", func(t *testing.T) {
		p := MakePlan(cur, desired, "sync", false)
		if got, want := kinds(p), []string{"~bad", "~changed", "+new"}; !slices.Equal(got, want) {
			t.Errorf("actions %v, want %v", got, want)
		}
		if !slices.Equal(p.Unchanged, []string{"p", "same"}) {
			t.Errorf("unchanged %v", p.Unchanged)
		}
		if !slices.Equal(p.NotPruned, []string{"gone"}) {
			t.Errorf("not pruned %v, want only gone (own owner)", p.NotPruned)
		}
		for _, a := range p.Actions {
			if a.Entry.Owner != "sync" {
				t.Errorf("%s: owner %q, want sync", a.ID, a.Entry.Owner)
			}
			switch a.ID {
			case "changed":
				if a.Revision != 4 || len(a.Changes) != 1 || a.Changes[0].Field != "cron" || a.Changes[0].Old != "@daily" || a.Changes[0].New != "@hourly" {
					t.Errorf("changed: revision %d changes %v", a.Revision, a.Changes)
				}
			case "new":
				if a.Revision != 0 {
					t.Errorf("new: revision %d, want 0 (must not exist)", a.Revision)
				}
			case "bad":
				if !a.Repair || a.Revision != 9 {
					t.Errorf("bad: repair %v revision %d", a.Repair, a.Revision)
				}
			}
		}
	})
	t.Run("prune removes only own entries", func(t *testing.T) {
		p := MakePlan(cur, desired, "sync", true)
		if got, want := kinds(p), []string{"~bad", "~changed", "-gone", "+new"}; !slices.Equal(got, want) {
			t.Errorf("actions %v, want %v (manual, other and bad are never pruned)", got, want)
		}
		if len(p.NotPruned) != 0 {
			t.Errorf("not pruned %v with prune", p.NotPruned)
		}
		if p.Count(Remove) != 1 || p.Count(Create) != 1 || p.Count(Update) != 2 {
			t.Errorf("counts %d %d %d", p.Count(Create), p.Count(Update), p.Count(Remove))
		}
	})
	t.Run("another owner takes nothing of sync", func(t *testing.T) {
		p := MakePlan(cur, nil, "team3", true)
		if !p.Empty() {
			t.Errorf("owner team3 with no configs plans %v", kinds(p))
		}
	})
	t.Run("adopting a manual entry sets the owner", func(t *testing.T) {
		p := MakePlan(cur, []Config{{Entry: entry("manual", "@daily")}}, "sync", false)
		if got := kinds(p); !slices.Equal(got, []string{"~manual"}) {
			t.Fatalf("actions %v", got)
		}
		if c := p.Actions[0].Changes; len(c) != 1 || c[0].Field != "owner" || c[0].New != "sync" {
			t.Errorf("changes %v, want owner only", c)
		}
	})
}

func TestMakePlanPause(t *testing.T) {
	paused := owned(entry("p", "@daily"), "sync")
	paused.Paused, paused.Note = true, "by hand"
	cur := []events.Current{current(paused, 2)}
	cases := []struct {
		name       string
		cfg        Config
		wantPaused bool
		wantNote   string
		wantAction bool
	}{
		{"file silent keeps pause and note", Config{Entry: entry("p", "@daily")}, true, "by hand", false},
		{"file silent, spec changes, pause kept", Config{Entry: entry("p", "@hourly")}, true, "by hand", true},
		{"file says paused: false resumes", Config{Entry: entry("p", "@daily"), Paused: boolp(false)}, false, "", true},
		{"file says paused: true", Config{Entry: entry("p", "@daily"), Paused: boolp(true)}, true, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := MakePlan(cur, []Config{tc.cfg}, "sync", false)
			if (len(p.Actions) == 1) != tc.wantAction {
				t.Fatalf("actions %v, want action %v", kinds(p), tc.wantAction)
			}
			if !tc.wantAction {
				return
			}
			e := p.Actions[0].Entry
			if e.Paused != tc.wantPaused || e.Note != tc.wantNote {
				t.Errorf("paused %v note %q, want %v %q", e.Paused, e.Note, tc.wantPaused, tc.wantNote)
			}
		})
	}
	// A new entry whose config is silent is not paused.
	p := MakePlan(nil, []Config{{Entry: entry("n", "@daily")}}, "sync", false)
	if p.Actions[0].Entry.Paused {
		t.Errorf("new entry paused")
	}
}

func TestDiff(t *testing.T) {
	a := entry("x", "@daily")
	a.Task.Payload = []byte(`{"a":1}`)
	a.Task.Headers = map[string]string{"k": "v", "gone": "1"}
	b := a.Clone()
	b.Cron = "0 9 * * *"
	b.Options.Queue = "critical"
	b.Task.Headers = map[string]string{"k": "w"}
	b.Task.Payload = []byte{0xff, 0x00}
	got := map[string]FieldChange{}
	for _, c := range Diff(a, b) {
		got[c.Field] = c
	}
	want := map[string][2]string{
		"cron":              {"@daily", "0 9 * * *"},
		"options.queue":     {"default", "critical"},
		"task.headers.k":    {"v", "w"},
		"task.headers.gone": {"1", ""},
	}
	for f, w := range want {
		if c, ok := got[f]; !ok || c.Old != w[0] || c.New != w[1] {
			t.Errorf("%s: %+v, want %v", f, c, w)
		}
	}
	if c := got["task.payload"]; c.Old != `{"a":1}` || !strings.Contains(c.New, "binary") {
		t.Errorf("payload change %+v", c)
	}
	if len(got) != len(want)+1 {
		t.Errorf("changes %v", got)
	}
	if d := Diff(a, a.Normalize()); len(d) != 0 {
		t.Errorf("defaults written out count as changes: %v", d)
	}
	if s := (FieldChange{Field: "cron", Old: "@daily", New: "0 9 * * *"}).String(); s != `cron: @daily → '0 9 * * *'` {
		t.Errorf("String = %s", s)
	}
	// Long payloads that differ only after the shown part still differ.
	long1, long2 := strings.Repeat("x", 200)+"1", strings.Repeat("x", 200)+"2"
	if PayloadText([]byte(long1)) == PayloadText([]byte(long2)) {
		t.Errorf("PayloadText hides a difference")
	}
}
