package streamclient

import (
	"testing"

	"github.com/cronstream/cronstream/contract"
)

// TestPauseOnFailureIsGated: an entry with pause_on_failure is written
// under the gated types (an earlier build's client would drop the field on
// a rewrite, its replica would never pause), reads back strictly, and one
// without it is written under the plain types.
func TestPauseOnFailureIsGated(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, c := newSingle(t, "gatedpof")
	e := validEntry("p")
	e.PauseOnFailure = true
	r, err := c.Put(ctx, e)
	if err != nil || r.Type != contract.TypeEntryRegistered+contract.GatedSuffix {
		t.Fatalf("put: %+v %v", r, err)
	}
	if r, err = c.Pause(ctx, "p", "paused on failure: task x"); err != nil || r.Type != contract.TypeEntryPaused+contract.GatedSuffix {
		t.Fatalf("pause: %+v %v", r, err)
	}
	got, _, err := c.Get(ctx, "p")
	if err != nil || !got.PauseOnFailure || !got.Paused {
		t.Fatalf("get: %+v %v", got, err)
	}
	got.PauseOnFailure = false
	if r, err = c.Put(ctx, got); err != nil || r.Type != contract.TypeEntryUpdated {
		t.Fatalf("put without pause_on_failure: %+v %v", r, err)
	}
}
