package contract

import (
	"reflect"
	"testing"
)

// Entries decoded apart hold their repeated values once: equal label and
// header maps are one map, repeated strings one string; a later decode
// never changes an earlier entry.
func TestDecodedEntriesShareRepeatedValues(t *testing.T) {
	decode := func(id string, labels map[string]string) *Entry {
		t.Helper()
		e := Entry{ID: id, Cron: "0 9 * * 1-5", Timezone: "Europe/Berlin", Task: Task{Type: "billing:run", Headers: map[string]string{"source": "cron"}},
			Options: Options{Queue: "billing"}, Labels: labels, Owner: "sync"}
		// Labels make it gated: decoded by encoding/json, not the fast path.
		ev, err := NewEvent(GatedType(TypeEntryRegistered, e), "test", id, e)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := DecodeConfigEvent(b)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	a := decode("a", map[string]string{"team": "billing", "tier": "critical"})
	b := decode("b", map[string]string{"tier": "critical", "team": "billing"})
	c := decode("c", map[string]string{"team": "billing", "tier": "batch"})
	same := func(x, y map[string]string) bool { return reflect.ValueOf(x).Pointer() == reflect.ValueOf(y).Pointer() }
	if !same(a.Labels, b.Labels) || !same(a.Task.Headers, b.Task.Headers) {
		t.Error("equal label or header maps of two entries are held twice")
	}
	if same(a.Labels, c.Labels) || c.Labels["tier"] != "batch" || a.Labels["tier"] != "critical" {
		t.Errorf("different labels were merged: a %v, c %v", a.Labels, c.Labels)
	}
	if reflect.ValueOf(a.Cron).Pointer() != reflect.ValueOf(b.Cron).Pointer() {
		t.Error("a repeated cron spec is held twice")
	}
}
