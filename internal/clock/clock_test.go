package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A local clock an hour off reads right once synced against the source.
func TestOffsetCorrected(t *testing.T) {
	for _, off := range []time.Duration{time.Hour, -time.Hour} {
		c := New(func(context.Context) (time.Time, error) { return time.Now(), nil }, Options{LocalOffset: off})
		if d := c.Now().Sub(time.Now()); d < off-time.Second || d > off+time.Second {
			t.Fatalf("offset %s: before Sync the clock is %s off, want the offset", off, d)
		}
		if err := c.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := c.Now().Sub(time.Now()); d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Errorf("offset %s: after Sync the clock is %s off", off, d)
		}
		if o, ok := c.Offset(); !ok || o > -off+time.Second || o < -off-time.Second {
			t.Errorf("offset %s: measured %s, %v", off, o, ok)
		}
	}
}

func TestSyncError(t *testing.T) {
	boom := errors.New("unreachable")
	c := New(func(context.Context) (time.Time, error) { return time.Time{}, boom }, Options{})
	if err := c.Sync(context.Background()); !errors.Is(err, boom) {
		t.Errorf("Sync = %v", err)
	}
	if _, ok := c.Offset(); ok {
		t.Error("an offset was measured from a failed Sync")
	}
	if err := Local().Sync(context.Background()); err != nil {
		t.Errorf("Local().Sync = %v", err)
	}
}
