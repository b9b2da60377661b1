package streamclient

import (
	"testing"

	"github.com/cronstream/cronstream/contract"
)

// TestClientWritesGatedTypes: the client publishes an entry with schedule
// fields under the gated types, its removal under the plain one, and goes
// back to the plain types once the fields are cleared.
func TestClientWritesGatedTypes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, c := newSingle(t, "gated")
	e := validEntry("w")
	e.Labels = map[string]string{"team": "a"}
	r, err := c.Put(ctx, e)
	if err != nil || r.Type != contract.TypeEntryRegistered+contract.GatedSuffix {
		t.Fatalf("put: %+v %v", r, err)
	}
	if r, err = c.Pause(ctx, "w", "x"); err != nil || r.Type != contract.TypeEntryPaused+contract.GatedSuffix {
		t.Fatalf("pause: %+v %v", r, err)
	}
	got, _, err := c.Get(ctx, "w")
	if err != nil || got.Labels["team"] != "a" || !got.Paused {
		t.Fatalf("get: %+v %v", got, err)
	}
	got.Labels = nil
	if r, err = c.Put(ctx, got); err != nil || r.Type != contract.TypeEntryUpdated {
		t.Fatalf("put without labels: %+v %v", r, err)
	}
	if r, err = c.Remove(ctx, "w"); err != nil || r.Type != contract.TypeEntryRemoved {
		t.Fatalf("remove: %+v %v", r, err)
	}
	// A fire limit is gated too: an earlier build would fire past it.
	e = validEntry("m")
	e.MaxFires = 3
	if r, err = c.Put(ctx, e); err != nil || r.Type != contract.TypeEntryRegistered+contract.GatedSuffix {
		t.Fatalf("put with max_fires: %+v %v", r, err)
	}
	if got, _, err = c.Get(ctx, "m"); err != nil || got.MaxFires != 3 {
		t.Fatalf("get with max_fires: %+v %v", got, err)
	}
}

// TestOverlapCancelPreviousClientGated: the Go client publishes an entry
// with overlap cancel-previous under the gated type and reads it back; the
// same entry back on allow is written under the plain type.
func TestOverlapCancelPreviousClientGated(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, c := newSingle(t, "gatedcancel")
	e := validEntry("can")
	e.Overlap = contract.OverlapCancelPrevious
	r, err := c.Put(ctx, e)
	if err != nil || r.Type != contract.TypeEntryRegistered+contract.GatedSuffix {
		t.Fatalf("put: %+v %v", r, err)
	}
	got, _, err := c.Get(ctx, "can")
	if err != nil || got.Overlap != contract.OverlapCancelPrevious {
		t.Fatalf("get: %+v %v", got, err)
	}
	got.Overlap = contract.OverlapAllow
	if r, err = c.Put(ctx, got); err != nil || r.Type != contract.TypeEntryUpdated {
		t.Fatalf("put with overlap allow: %+v %v", r, err)
	}
}
