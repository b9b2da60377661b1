// Package bgloop holds the lifecycle shared by components that are one
// background loop: Start runs the loop once, on a context of its own that
// keeps the start context's values but not its end; Stop cancels that
// context and waits for the loop to return.
package bgloop

import (
	"context"
	"sync"
)

// Loop runs one function in the background at most once. The zero value
// is ready to use; a Loop must not be copied after first use.
type Loop struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start runs run in a goroutine on a context that Stop cancels. Calling
// it again, or after Stop, does nothing.
func (l *Loop) Start(ctx context.Context, run func(context.Context)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return
	}
	l.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.cancel, l.done = cancel, make(chan struct{})
	go func() {
		defer close(l.done)
		run(runCtx)
	}()
}

// Stop cancels the loop's context and waits for run to return. It may be
// called more than once, and without Start (a Start after it then does
// nothing, so no loop runs that nobody waits for).
func (l *Loop) Stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.started = true
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
