package contract

import (
	"strings"
	"testing"
)

// TestOverlapBufferOne: buffer-one is valid alone and with max_fires,
// refused with a group or a unique lock, and gated (earlier builds, which reject the value in
// validation, refuse the event type too).
func TestOverlapBufferOne(t *testing.T) {
	t.Parallel()
	e := validEntry("buf")
	e.Overlap = OverlapBufferOne
	if err := e.Normalize().Validate(); err != nil {
		t.Fatalf("buffer-one: %v", err)
	}
	if !e.Gated() || GatedType(TypeEntryRegistered, e) != TypeEntryRegistered+GatedSuffix {
		t.Error("an entry with overlap buffer-one is not gated")
	}
	for field, mod := range map[string]func(*Entry){
		"options.group":  func(e *Entry) { e.Options.Group = "g" },
		"options.unique": func(e *Entry) { e.Options.Unique = Duration(60e9) },
	} {
		bad := e.Clone()
		mod(&bad)
		err := bad.Normalize().Validate()
		if err == nil || !strings.Contains(err.Error(), "cannot be combined with "+field) {
			t.Errorf("buffer-one with %s: %v", field, err)
		}
	}
	// max_fires combines with it: a release counts as a fire.
	limited := e.Clone()
	limited.MaxFires = 3
	if err := limited.Normalize().Validate(); err != nil {
		t.Errorf("buffer-one with max_fires: %v", err)
	}
	e.Overlap = "sometimes"
	if err := e.Normalize().Validate(); err == nil || !strings.Contains(err.Error(), "must be allow, skip, buffer-one or cancel-previous") {
		t.Errorf("unknown overlap: %v", err)
	}
}

// TestOverlapCancelPrevious: cancel-previous is valid alone, refused with a
// group, a unique lock or max_fires (its held tick is released as a plain
// pending task, as buffer-one's), and gated.
func TestOverlapCancelPrevious(t *testing.T) {
	t.Parallel()
	e := validEntry("can")
	e.Overlap = OverlapCancelPrevious
	if err := e.Normalize().Validate(); err != nil {
		t.Fatalf("cancel-previous: %v", err)
	}
	if !e.Gated() || GatedType(TypeEntryUpdated, e) != TypeEntryUpdated+GatedSuffix {
		t.Error("an entry with overlap cancel-previous is not gated")
	}
	for field, mod := range map[string]func(*Entry){
		"options.group":  func(e *Entry) { e.Options.Group = "g" },
		"options.unique": func(e *Entry) { e.Options.Unique = Duration(60e9) },
		"max_fires":      func(e *Entry) { e.MaxFires = 3 },
	} {
		bad := e.Clone()
		mod(&bad)
		err := bad.Normalize().Validate()
		if err == nil || !strings.Contains(err.Error(), "cannot be combined with "+field) {
			t.Errorf("cancel-previous with %s: %v", field, err)
		}
	}
}
