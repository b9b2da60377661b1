package scheduler_test

import (
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestEntriesGaugeCountsPausedAtStart: an entry paused before the replica
// started is known to it (it lists it to asynq marked paused) and counts
// in the entries gauge, once, through resume, pause and removal.
func TestEntriesGaugeCountsPausedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(every("active", "@every 1h"), every("held", "@every 1h", func(en *events.Entry) { en.Paused = true }))
	n := e.startNode("r1", nodeOpts{})
	entries := func(want int) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, func() bool { return n.counts().Entries == want },
			"entries gauge %d, want %d", n.counts().Entries, want)
	}
	entries(2)
	c := testenv.Context(t, 30*time.Second)
	if _, err := e.client.Resume(c, "held"); err != nil {
		t.Fatal(err)
	}
	entries(2)
	if _, err := e.client.Pause(c, "held", "again"); err != nil {
		t.Fatal(err)
	}
	entries(2)
	if _, err := e.client.Remove(c, "held"); err != nil {
		t.Fatal(err)
	}
	entries(1)
}
