package projector

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
)

// pumped is one Pump running on a subscription of its own, as a
// component runs it.
type pumped struct {
	t    *testing.T
	sub  *Subscription
	out  chan Batch
	done chan struct{} // closed when Pump has returned
}

func pump(ctx context.Context, t *testing.T, p *Projector) *pumped {
	pu := &pumped{t: t, sub: p.Subscribe(), out: make(chan Batch), done: make(chan struct{})}
	go func() {
		defer close(pu.done)
		pu.sub.Pump(ctx, pu.out)
	}()
	return pu
}

// next is the next batch Pump hands over.
func (pu *pumped) next() Batch {
	pu.t.Helper()
	select {
	case b, ok := <-pu.out:
		if !ok {
			pu.t.Fatal("Pump closed its channel while the subscription was live")
		}
		return b
	case <-time.After(10 * time.Second):
		pu.t.Fatal("Pump handed over no batch within 10 s")
	}
	return Batch{}
}

// ended checks that Pump has returned, closing its channel and the
// subscription.
func (pu *pumped) ended() {
	pu.t.Helper()
	select {
	case <-pu.done:
	case <-time.After(10 * time.Second):
		pu.t.Fatal("Pump did not return within 10 s")
	}
	select {
	case b, ok := <-pu.out:
		if ok {
			pu.t.Errorf("Pump handed over %+v after it returned", b)
		}
	default:
		pu.t.Error("Pump returned without closing its channel")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := pu.sub.Next(ctx); !errors.Is(err, ErrClosed) {
		pu.t.Errorf("Next after Pump returned = %v, want ErrClosed", err)
	}
}

// TestSubscriptionPump: Pump hands the subscription's batches to the
// component's channel in order, numbered as NextMarked numbers them; when
// its context ends (while it waits for changes, or holds a batch nobody
// takes) or the projector stops, it closes the subscription and the
// channel and returns (goleak, in TestMain, finds a goroutine left).
func TestSubscriptionPump(t *testing.T) {
	t.Parallel()
	_, js := startNATS(t)
	e := validEntry("pump")
	publishEvent(t, js, events.TypeEntryRegistered, e)
	p := startProjector(t, js, Config{})
	waitCtx := testCtx(t, 30*time.Second)
	if err := p.WaitCaughtUp(waitCtx); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pu := pump(ctx, t, p)
	if b := pu.next(); b.Mark != 1 || len(b.Changes) != 1 || b.Changes[0].ID != "pump" || b.Changes[0].Old != nil || b.Changes[0].New == nil {
		t.Fatalf("first batch %+v, want mark 1 registering the entry", b)
	}
	e.Note = "changed"
	seq := publishEvent(t, js, events.TypeEntryUpdated, e)
	b := pu.next()
	if b.Mark != 2 || len(b.Changes) != 1 || b.Changes[0].Seq != seq || b.Changes[0].Old == nil || b.Changes[0].New == nil || b.Changes[0].New.Entry.Note != "changed" {
		t.Fatalf("second batch %+v, want mark 2 with the update at seq %d", b, seq)
	}
	// Nothing pending: Pump waits for changes when its context ends.
	cancel()
	pu.ended()

	// A subscription starts with a batch; nobody takes it.
	ctx, cancel = context.WithCancel(context.Background())
	pu = pump(ctx, t, p)
	cancel()
	pu.ended()

	// The projector stops: the subscription ends, and Pump with it.
	pu = pump(context.Background(), t, p)
	pu.next()
	if err := p.Stop(waitCtx); err != nil {
		t.Fatal(err)
	}
	pu.ended()
}
