package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ctxKey struct{}

// loop is a component of one goroutine that runs until its context ends.
type loop struct {
	life  Lifecycle
	runs  atomic.Int32
	ended chan struct{}
}

func newLoop() *loop { return &loop{ended: make(chan struct{})} }

func (c *loop) Start(ctx context.Context) error {
	return c.life.StartLoop(ctx, func(ctx context.Context) {
		c.runs.Add(1)
		<-ctx.Done()
		close(c.ended)
	})
}

func (c *loop) isEnded() bool {
	select {
	case <-c.ended:
		return true
	default:
		return false
	}
}

// TestRules walks a component through each rule of the package doc.
func TestRules(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		walk func(t *testing.T, c *loop)
	}{
		{"start twice", func(t *testing.T, c *loop) {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); !errors.Is(err, ErrAlreadyStarted) {
				t.Fatalf("second Start = %v, want ErrAlreadyStarted", err)
			}
			if !c.life.Stop() {
				t.Fatal("Stop of a running component reported it was not running")
			}
			if n := c.runs.Load(); n != 1 {
				t.Fatalf("%d runs, want 1", n)
			}
		}},
		{"stop before start", func(t *testing.T, c *loop) {
			if c.life.Stop() {
				t.Fatal("Stop before Start reported a running component")
			}
			if err := c.Start(ctx); !errors.Is(err, ErrStopped) {
				t.Fatalf("Start after Stop = %v, want ErrStopped", err)
			}
			if n := c.runs.Load(); n != 0 {
				t.Fatalf("%d runs after Stop, want 0", n)
			}
		}},
		{"stop twice", func(t *testing.T, c *loop) {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if !c.life.Stop() || !c.isEnded() {
				t.Fatal("Stop returned before the goroutine ended")
			}
			if c.life.Stop() {
				t.Fatal("second Stop reported a running component")
			}
		}},
		{"start after stop", func(t *testing.T, c *loop) {
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			c.life.Stop()
			if err := c.Start(ctx); !errors.Is(err, ErrStopped) {
				t.Fatalf("Start after Stop = %v, want ErrStopped", err)
			}
			if n := c.runs.Load(); n != 1 {
				t.Fatalf("%d runs, want 1", n)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.walk(t, newLoop()) })
	}
}

// TestRunContext: the goroutines keep the start context's values, outlive
// its end, and end with Stop.
func TestRunContext(t *testing.T) {
	var l Lifecycle
	startCtx, cancelStart := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	ended := make(chan struct{})
	err := l.Start(startCtx, func(context.Context) error {
		l.Go(func(ctx context.Context) {
			if ctx.Value(ctxKey{}) != "v" {
				t.Error("the run context lost the start context's values")
			}
			if ctx != l.Context() {
				t.Error("Go's context is not Context()")
			}
			<-ctx.Done()
			close(ended)
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cancelStart()
	if err := l.Context().Err(); err != nil {
		t.Fatalf("the run context ended with the start context: %v", err)
	}
	l.Stop()
	select {
	case <-ended:
	default:
		t.Fatal("Stop returned before the goroutine ended")
	}
}

// TestFailedSetup: a setup error is Start's; what setup started has ended
// when Start returns, and Start may be called again.
func TestFailedSetup(t *testing.T) {
	var l Lifecycle
	boom := errors.New("boom")
	var ended atomic.Bool
	err := l.Start(context.Background(), func(context.Context) error {
		l.Go(func(ctx context.Context) {
			<-ctx.Done()
			ended.Store(true)
		})
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Start = %v, want the setup's error", err)
	}
	if !ended.Load() {
		t.Fatal("a goroutine of the failed setup outlived Start")
	}
	if err := l.Start(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Start after a failed setup = %v", err)
	}
	if !l.Stop() {
		t.Fatal("Stop after the second Start reported nothing running")
	}
}

// TestStopDuringStart: Stop cancels the setup under way and waits for
// Start, which returns ErrStopped.
func TestStopDuringStart(t *testing.T) {
	var l Lifecycle
	inSetup := make(chan struct{})
	started := make(chan error, 1)
	var ended atomic.Bool
	go func() {
		started <- l.Start(context.Background(), func(ctx context.Context) error {
			l.Go(func(ctx context.Context) {
				<-ctx.Done()
				ended.Store(true)
			})
			close(inSetup)
			<-ctx.Done() // a setup that waits for something, bounded by ctx
			return ctx.Err()
		})
	}()
	<-inSetup
	if err := l.Start(context.Background(), func(context.Context) error { return nil }); !errors.Is(err, ErrAlreadyStarted) {
		t.Fatalf("Start during Start = %v, want ErrAlreadyStarted", err)
	}
	if l.Stop() {
		t.Fatal("Stop during Start reported a running component")
	}
	if !ended.Load() {
		t.Fatal("Stop returned before the setup's goroutine ended")
	}
	if err := <-started; !errors.Is(err, ErrStopped) {
		t.Fatalf("Start stopped meanwhile = %v, want ErrStopped", err)
	}
}

// TestConcurrentStop: of Stops called together one stops the component,
// and none returns before its goroutines have ended.
func TestConcurrentStop(t *testing.T) {
	c := newLoop()
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const n = 8
	results := make(chan bool, n)
	for range n {
		go func() {
			ran := c.life.Stop()
			if !c.isEnded() {
				t.Error("a Stop returned before the goroutine ended")
			}
			results <- ran
		}()
	}
	stoppers := 0
	for range n {
		if <-results {
			stoppers++
		}
	}
	if stoppers != 1 {
		t.Fatalf("%d Stops reported stopping the component, want 1", stoppers)
	}
}

// TestDrain: Drain lets the goroutines finish the work in hand after
// Stopping closes; one that does not finish within ctx is cancelled and
// Drain returns ctx's error.
func TestDrain(t *testing.T) {
	t.Run("finishes", func(t *testing.T) {
		var l Lifecycle
		var cancelled atomic.Bool
		_ = l.Start(context.Background(), func(context.Context) error {
			l.Go(func(ctx context.Context) {
				<-l.Stopping()
				cancelled.Store(ctx.Err() != nil)
			})
			return nil
		})
		ran, err := l.Drain(context.Background())
		if !ran || err != nil {
			t.Fatalf("Drain = %v, %v; want true, nil", ran, err)
		}
		if cancelled.Load() {
			t.Fatal("the run context ended before the goroutine finished")
		}
	})
	t.Run("cut short", func(t *testing.T) {
		var l Lifecycle
		_ = l.Start(context.Background(), func(context.Context) error {
			l.Go(func(ctx context.Context) { <-ctx.Done() })
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		ran, err := l.Drain(ctx)
		if !ran || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Drain = %v, %v; want true, DeadlineExceeded", ran, err)
		}
	})
	t.Run("before start", func(t *testing.T) {
		var l Lifecycle
		if ran, err := l.Drain(context.Background()); ran || err != nil {
			t.Fatalf("Drain before Start = %v, %v; want false, nil", ran, err)
		}
		select {
		case <-l.Stopping():
		default:
			t.Fatal("Stopping is open after Drain")
		}
	})
}
