package asynqcompat_test

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/replicatest"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

// testCtx ends with the test, bounded so a hang fails instead of stalling.
func testCtx(t testing.TB) context.Context { return testenv.Context(t, 2*time.Minute) }

// natsEnv is a NATS server for one test with the streams of prefix, and a
// config client on them.
func natsEnv(t *testing.T, prefix string) (*testenv.NATS, jetstream.JetStream, *events.Client) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	names := events.MustNames(prefix)
	if err := events.EnsureStreams(testCtx(t), js, events.StreamConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	return n, js, events.NewClient(js, names)
}

// quiet is a logger that drops everything.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startReplica runs a cronstream replica until the test ends.
func startReplica(t *testing.T, ns *testenv.NATS, rc redis.UniversalClient, names events.Names, id string) {
	t.Helper()
	replicatest.Start(t, replica.Config{NATSURL: ns.URL(), Redis: rc, Names: names, ReplicaID: id, SkipRedisChecks: true})
}

// listed returns the live entries of c by id.
func listed(t *testing.T, c *events.Client) map[string]events.Entry {
	t.Helper()
	cur, err := c.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]events.Entry{}
	for _, e := range cur {
		if e.Err != nil {
			t.Fatalf("entry %s quarantined: %v", e.ID, e.Err)
		}
		out[e.ID] = e.Entry
	}
	return out
}

// TestCoreStaysFreeOfAsynq: only this package brings asynq into a build;
// the binary and the core packages do not depend on it.
func TestCoreStaysFreeOfAsynq(t *testing.T) {
	pkgs := []string{"./cmd/cronstream", "./events", "./configsync", "./internal/scheduler", "./projector", "./internal/recoverer", "./contract", "./streamclient", "./schedule", "./audit", "./internal/clock", "./internal/asynqconv"}
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/hibiken/asynq") || p == "github.com/cronstream/cronstream/asynqcompat" {
			t.Errorf("%s is among the dependencies of the core packages and the binary", p)
		}
	}
}
