package projector

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A projection from a fold is caught up at once, serves what the fold
// holds to every subscriber, refuses to start, and ends its subscriptions
// at Stop.
func TestFromFold(t *testing.T) {
	t.Parallel()
	if _, err := FromFold(testNames, nil); err == nil {
		t.Fatal("FromFold(nil) returned no error")
	}
	p, err := FromFold(testNames, foldRealistic(t, 5))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.WaitCaughtUp(ctx); err != nil || !p.CaughtUp() {
		t.Fatalf("not caught up: %v", err)
	}
	if p.Len() != 5 || len(p.Queues()) == 0 {
		t.Fatalf("%d entries, queues %v", p.Len(), p.Queues())
	}
	if err := p.Start(ctx); !errors.Is(err, ErrAlreadyStarted) {
		t.Errorf("Start = %v, want ErrAlreadyStarted", err)
	}
	for range 2 {
		sub := p.Subscribe()
		changes, err := sub.Next(ctx)
		if err != nil || len(changes) != 5 {
			t.Fatalf("a subscriber got %d changes, %v; want the 5 entries", len(changes), err)
		}
		defer sub.Close()
	}
	sub := p.Subscribe()
	if _, err := sub.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("Next after Stop = %v, want ErrStopped", err)
	}
}
