package clock

import (
	"context"
	"errors"
	"sync/atomic"
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

// Durations from Mono ignore the offset and its corrections; the zero Mono
// is long past.
func TestMono(t *testing.T) {
	var off atomic.Int64
	c := New(func(context.Context) (time.Time, error) { return time.Now().Add(time.Duration(off.Load())), nil }, Options{LocalOffset: time.Hour})
	start := c.Mono()
	off.Store(int64(24 * time.Hour))
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := c.Since(start); d < 0 || d > time.Second {
		t.Errorf("Since across a Sync moving the clock a day = %s", d)
	}
	deadline := start.Add(time.Minute)
	if d := c.Until(deadline); d < time.Minute-time.Second || d > time.Minute {
		t.Errorf("Until a minute after start = %s", d)
	}
	if !start.Before(deadline) || deadline.Before(start) {
		t.Error("Before disagrees with Add")
	}
	var zero Mono
	if c.Since(zero) < 24*time.Hour || c.Until(zero) > 0 || !zero.Before(start) {
		t.Errorf("zero Mono: Since %s, Until %s", c.Since(zero), c.Until(zero))
	}
}
