package clock

import (
	"testing"
	"time"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// received reports whether ch holds a value, and takes it.
func received(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

// A manual clock moves only when told; Now, Mono and durations follow it.
func TestManualNow(t *testing.T) {
	m := NewManual(epoch)
	c := New(nil, Options{Manual: m, LocalOffset: time.Hour})
	start := c.Mono()
	if got := c.Now(); !got.Equal(epoch.Add(time.Hour)) {
		t.Fatalf("Now = %s, want the manual time plus the offset", got)
	}
	m.Advance(90 * time.Second)
	if d := c.Since(start); d != 90*time.Second {
		t.Errorf("Since after Advance(90s) = %s", d)
	}
	m.AdvanceTo(epoch) // never back
	if got := m.Now(); !got.Equal(epoch.Add(90 * time.Second)) {
		t.Errorf("AdvanceTo an earlier time moved the clock back to %s", got)
	}
}

// Timers fire in deadline order at their deadline, count as outstanding
// until Reset or Stopped, and drop an undelivered value on Reset.
func TestManualTimer(t *testing.T) {
	m := NewManual(epoch)
	c := New(nil, Options{Manual: m})
	a, b := c.NewTimer(2*time.Second), c.NewTimer(time.Second)
	if next, ok := m.Next(); !ok || !next.Equal(epoch.Add(time.Second)) {
		t.Fatalf("Next = %s %v, want the earlier deadline", next, ok)
	}
	m.Advance(1500 * time.Millisecond)
	if v, ok := received(b.C); !ok || !v.Equal(epoch.Add(time.Second)) {
		t.Fatalf("b delivered %s %v, want its deadline", v, ok)
	}
	if _, ok := received(a.C); ok {
		t.Fatal("a fired before its deadline")
	}
	if n := m.Outstanding(); n != 1 {
		t.Fatalf("Outstanding = %d after one timer fired, want 1", n)
	}
	if b.Reset(time.Second) {
		t.Error("Reset of a fired timer says it was armed")
	}
	if n := m.Outstanding(); n != 0 {
		t.Fatalf("Outstanding = %d after the fired timer was Reset", n)
	}
	m.Advance(time.Second) // a at +2s, b at +2.5s
	if _, ok := received(a.C); !ok {
		t.Fatal("a did not fire")
	}
	if _, ok := received(b.C); !ok {
		t.Fatal("b did not fire after its Reset")
	}
	if n := m.Outstanding(); n != 2 {
		t.Fatalf("Outstanding = %d, want 2", n)
	}
	a.Stop()
	b.Reset(time.Hour)
	if n := m.Outstanding(); n != 0 {
		t.Fatalf("Outstanding = %d after Stop and Reset", n)
	}
	// A fired value not received is dropped by Reset.
	m.Advance(time.Hour)
	b.Reset(time.Minute)
	if _, ok := received(b.C); ok {
		t.Error("a stale value was received after Reset")
	}
	// Reset(0) delivers at once.
	b.Reset(0)
	if _, ok := received(b.C); !ok {
		t.Error("Reset(0) did not deliver at once")
	}
	if b.Stop() {
		t.Error("Stop of a fired timer says it was armed")
	}
}

// A ticker fires every period and drops what a slow reader misses; it
// never counts as outstanding.
func TestManualTicker(t *testing.T) {
	m := NewManual(epoch)
	c := New(nil, Options{Manual: m})
	tk := c.NewTicker(time.Second)
	defer tk.Stop()
	m.Advance(3500 * time.Millisecond)
	if v, ok := received(tk.C); !ok || !v.Equal(epoch.Add(time.Second)) {
		t.Fatalf("first tick %s %v", v, ok)
	}
	if _, ok := received(tk.C); ok {
		t.Fatal("missed ticks were queued")
	}
	if n := m.Outstanding(); n != 0 {
		t.Errorf("a ticker counts as outstanding (%d)", n)
	}
	if next, _ := m.Next(); !next.Equal(epoch.Add(4 * time.Second)) {
		t.Errorf("next tick at %s, want +4s", next)
	}
	tk.Stop()
	m.Advance(time.Hour)
	if _, ok := received(tk.C); ok {
		t.Error("a stopped ticker ticked")
	}
}

// Without a manual clock, timers are real ones.
func TestRealTimer(t *testing.T) {
	c := Local()
	tm := c.NewTimer(time.Millisecond)
	select {
	case <-tm.C:
	case <-time.After(10 * time.Second):
		t.Fatal("real timer did not fire")
	}
	if tm.Reset(time.Hour) {
		t.Error("Reset of a fired real timer says it was armed")
	}
	if !tm.Stop() {
		t.Error("Stop of an armed real timer says it was not")
	}
	tk := c.NewTicker(time.Millisecond)
	<-tk.C
	tk.Stop()
}
