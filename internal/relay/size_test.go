package relay_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

// TestRelayBacklogBytes: while NATS is down the relay reports the memory its
// backlog takes in Redis (MEMORY USAGE); where Redis refuses that command (an
// ACL without it) the size is estimated from the record count and the size
// of each outbox's oldest record, close to what Redis would have said for
// single records and for multi-records alike, and the relay says so once.
func TestRelayBacklogBytes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	e.write("default", "a", 50)
	e.writeTicks("multi", 640) // ten multi-records of 64 fires
	const records = 60
	c := ctx(t, 60*time.Second)

	// A Redis user that may do everything but MEMORY.
	if err := e.rc.Do(c, "ACL", "SETUSER", "outbox-nomemory", "on", ">pw", "~*", "&*", "+@all", "-memory").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.rc.Do(context.Background(), "ACL", "DELUSER", "outbox-nomemory").Err() })
	opts := *e.rc.Options()
	opts.Username, opts.Password = "outbox-nomemory", "pw"
	limited := redis.NewClient(&opts)
	t.Cleanup(func() { _ = limited.Close() })
	var logs testlog.Buffer

	sampled := e.newRelay("sampled", func(c *relay.Config) { c.PublishTimeout = time.Second })
	counted := e.newRelay("counted", func(c *relay.Config) {
		c.PublishTimeout = time.Second
		c.Outbox = taskstate.New(limited)
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	e.nats.Shutdown()
	for _, r := range []*relay.Relay{sampled, counted} {
		testenv.Eventually(t, 20*time.Second, func() bool {
			_, _ = r.Pass(c)
			return r.Backlog() == records
		}, "the backlog to show the waiting records (backlog %d)", r.Backlog())
	}
	var want int64
	for _, q := range []string{"default", "multi"} {
		b, err := e.store.OutboxBytes(c, prefix, q)
		if err != nil {
			t.Fatal(err)
		}
		want += b
	}
	if got := sampled.BacklogBytes(); got != want || got < 690*100 {
		t.Errorf("BacklogBytes %d, MEMORY USAGE says %d for 690 fires in %d records", got, want, records)
	}
	_, _ = counted.Pass(c)
	if got := counted.BacklogBytes(); got < want/2 || got > 2*want {
		t.Errorf("BacklogBytes without MEMORY USAGE %d, MEMORY USAGE says %d: want within a factor of 2", got, want)
	}
	if n := strings.Count(logs.String(), "Redis refused MEMORY USAGE"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, logs.String())
	}
}
