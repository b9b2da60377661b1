package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestNATSProcess builds the module's nats-server, runs it as a process,
// stores a message through JetStream, and stops it.
func TestNATSProcess(t *testing.T) {
	bin, err := BuildNATSServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := StartNATSProcess(t, bin)
	if !processAlive(p.PID()) {
		t.Fatalf("nats-server pid %d is not running", p.PID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := p.JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.x", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if processAlive(p.PID()) {
		t.Fatalf("nats-server pid %d still running after Stop", p.PID())
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
}
