// Package testlog holds log destinations for tests: a logger whose lines go
// to the test's own log, shown only when the test fails or runs verbose,
// and a buffer a test reads while the code under test writes to it. It is
// for tests only; non-test code must not import it.
package testlog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger returns a text logger into t's log that keeps records of level
// and above.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(Writer{T: t}, &slog.HandlerOptions{Level: level}))
}

// Writer writes what it is given to T's log, one call a log entry.
type Writer struct{ T testing.TB }

func (w Writer) Write(b []byte) (int, error) {
	w.T.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// Buffer is a bytes.Buffer that writers and a reader may use at once: a
// log destination the test reads while the code under test logs into it.
// Its zero value is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
