// Package lifecycle is the one Start and Stop every long-running component
// of a replica shares. A component holds a Lifecycle; its Start method calls
// Lifecycle.Start with the setup only it knows (open a consumer, write a
// first heartbeat, wait for the projection) and starts its goroutines with
// Go; its Stop method calls Stop, or Drain when it lets the work in hand
// finish, and then winds down what it holds (flush, release leases).
//
// The rules are the same for every component, and tested here once:
//
//   - Start twice (or while a Start is under way) returns ErrAlreadyStarted.
//   - A Start whose setup fails leaves the component unstarted: its
//     goroutines have ended and Start may be called again.
//   - Stop before Start returns at once; the component is stopped.
//   - Stop twice: the second call waits for the first to have stopped the
//     goroutines, then returns.
//   - Start after Stop returns ErrStopped: a component runs at most once.
//   - Stop during a Start cancels the setup's context and waits for Start
//     to return, which then returns ErrStopped.
//
// The goroutines run on a context of their own, which keeps the start
// context's values but not its end (a component outlives the request that
// started it); Stop cancels it and waits for every goroutine Go started.
package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// Errors of Start, which components return wrapped with their name.
var (
	ErrAlreadyStarted = errors.New("already started")
	ErrStopped        = errors.New("stopped")
)

type state int

const (
	idle state = iota
	starting
	running
	stopped
)

// Lifecycle holds a component's run: its state, the context its goroutines
// run on and the goroutines themselves. The zero value is ready to use; a
// Lifecycle must not be copied after first use.
type Lifecycle struct {
	mu    sync.Mutex
	state state
	// run is the goroutines' context and cancel ends it (set by Start).
	run    context.Context
	cancel context.CancelFunc
	// cancelSetup and setupDone belong to the Start under way: Stop
	// cancels its setup and waits for it to return.
	cancelSetup context.CancelFunc
	setupDone   chan struct{}
	// stopping is closed when Stop or Drain is first called; halted once
	// the goroutines have been waited for.
	stopping chan struct{}
	halted   chan struct{}
	wg       sync.WaitGroup
}

// chans makes the channels the zero value lacks; l.mu is held.
func (l *Lifecycle) chans() {
	if l.stopping == nil {
		l.stopping, l.halted = make(chan struct{}), make(chan struct{})
	}
}

// Start starts the component: it runs setup, which may start goroutines
// with Go, and returns setup's error. ctx bounds the setup (setup gets it,
// also cancelled by a Stop meanwhile); the goroutines run on a context
// that keeps ctx's values and ends with Stop. When setup fails, the
// goroutines it started are cancelled and waited for, and Start may be
// called again.
func (l *Lifecycle) Start(ctx context.Context, setup func(ctx context.Context) error) error {
	l.mu.Lock()
	switch l.state {
	case starting, running:
		l.mu.Unlock()
		return ErrAlreadyStarted
	case stopped:
		l.mu.Unlock()
		return ErrStopped
	}
	l.chans()
	l.state = starting
	setupCtx, cancelSetup := context.WithCancel(ctx)
	l.run, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	l.cancelSetup, l.setupDone = cancelSetup, make(chan struct{})
	done, cancel := l.setupDone, l.cancel
	l.mu.Unlock()

	err := setup(setupCtx)
	cancelSetup()

	l.mu.Lock()
	stopRequested := l.state == stopped
	if err == nil && !stopRequested {
		l.state = running
		close(done)
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	// Failed, or stopped meanwhile: nothing setup started outlives Start.
	cancel()
	l.wg.Wait()
	l.mu.Lock()
	if l.state == starting {
		l.state = idle
	}
	close(done)
	l.mu.Unlock()
	if stopRequested {
		return ErrStopped
	}
	return err
}

// StartLoop is Start for a component that is one loop: it runs loop in a
// goroutine and has no setup.
func (l *Lifecycle) StartLoop(ctx context.Context, loop func(ctx context.Context)) error {
	return l.Start(ctx, func(context.Context) error {
		l.Go(loop)
		return nil
	})
}

// Go runs f in a goroutine on the run context; Stop cancels that context
// and waits for f to return. Call it from Start's setup or from a
// goroutine Go started.
func (l *Lifecycle) Go(f func(ctx context.Context)) {
	l.mu.Lock()
	ctx := l.run
	l.mu.Unlock()
	if ctx == nil {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		ctx = c
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(ctx)
	}()
}

// Context returns the run context: the one Go's goroutines get, for work
// setup starts that outlives it. Before Start it is nil.
func (l *Lifecycle) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.run
}

// Stopping returns a channel closed once Stop or Drain has been called,
// whether or not the component was started: Drain's goroutines watch it to
// finish the work in hand, and direct calls (a test's Pass) to do no more.
func (l *Lifecycle) Stopping() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chans()
	return l.stopping
}

// Stop cancels the run context and waits for the goroutines. It reports
// whether this call stopped a running component: only then has the
// component anything to wind down. Before Start it only marks the
// component stopped; a second call waits for the first to have waited for
// the goroutines, and returns false.
func (l *Lifecycle) Stop() bool {
	ran, _ := l.stop(nil)
	return ran
}

// Drain is Stop for a component that finishes the work in hand: it closes
// Stopping and waits for the goroutines to return, until ctx ends; then it
// cancels the run context, waits for them, and returns ctx's error.
func (l *Lifecycle) Drain(ctx context.Context) (ran bool, err error) {
	return l.stop(ctx)
}

// stop is Stop (drain nil) and Drain.
func (l *Lifecycle) stop(drain context.Context) (bool, error) {
	l.mu.Lock()
	l.chans()
	prev := l.state
	l.state = stopped
	if prev != stopped {
		close(l.stopping)
	}
	halted := l.halted
	switch prev {
	case idle:
		close(halted)
		l.mu.Unlock()
		return false, nil
	case stopped:
		l.mu.Unlock()
		<-halted
		return false, nil
	case starting:
		l.cancelSetup()
		done := l.setupDone
		l.mu.Unlock()
		<-done // Start cancels and waits for what setup started
		close(halted)
		return false, nil
	}
	cancel := l.cancel
	l.mu.Unlock()
	defer close(halted)
	defer cancel()
	if drain == nil {
		cancel()
		l.wg.Wait()
		return true, nil
	}
	waited := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		return true, nil
	case <-drain.Done():
		cancel()
		<-waited
		return true, drain.Err()
	}
}
