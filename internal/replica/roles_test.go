package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
	"github.com/cronstream/cronstream/internal/testlog"
)

// TestExpectedRefusalsStopNothing: the refusals a replica meets in its
// ordinary work under the permissions file — a consumer the NATS client
// replaced and tries to delete, a missing stream it tries to create — are
// not counted as auth errors, do not make /readyz not ready and do not end
// a start; any other permission violation still does.
func TestExpectedRefusalsStopNothing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	logs := &testlog.Buffer{}
	w := newAuthWatch(reg, slog.New(slog.NewTextHandler(logs, nil)))
	w.armed.Store(true)
	violation := func(subject string) error {
		return fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subject)
	}
	for _, s := range []string{"$JS.API.CONSUMER.DELETE.CRONSTREAM_CONFIG.x_1", "$JS.API.STREAM.CREATE.KV_CRONSTREAM_REPLICAS"} {
		w.natsError(nil, nil, violation(s))
		if err := w.check(context.Background()); err != nil {
			t.Errorf("%s: not ready: %v", s, err)
		}
		if !expectedRefusal(violation(s)) || unrecoverableCause(violation(s)) == "" {
			t.Errorf("%s: not an expected refusal", s)
		}
	}
	if strings.Contains(logs.String(), "ERROR") {
		t.Errorf("an expected refusal was logged as an error:\n%s", logs)
	}
	w.natsError(nil, nil, violation("cronstream.fire.x"))
	if err := w.check(context.Background()); err == nil {
		t.Error("a refused activity publish left the replica ready")
	}
}

// TestReplicasBucketMovedToFile: a bucket an earlier build kept in memory
// is reported by a replica (CreateMissing: a difference, the bucket left
// as it is) and moved to file by `streams apply` (Apply: deleted and made
// again), keeping its name and settings; a bucket with a republish is
// refused in every mode.
func TestReplicasBucketMovedToFile(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	names := events.MustNames("movebucket")
	old := ReplicasBucketConfig(names, 1, DefaultUnresponsiveFor)
	old.Storage = jetstream.MemoryStorage
	if _, err := js.CreateKeyValue(ctx, old); err != nil {
		t.Fatal(err)
	}
	want := ReplicasBucketConfig(names, 1, DefaultUnresponsiveFor)
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.CreateMissing); err != nil || len(changes) != 1 || changes[0].Field != "storage" {
		t.Fatalf("a replica's look: %v %v", changes, err)
	}
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.Apply); err != nil || len(changes) != 1 {
		t.Fatalf("apply: %v %v", changes, err)
	}
	s, err := js.Stream(ctx, names.ReplicasStream())
	if err != nil || s.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Fatalf("after apply: %v %v", s, err)
	}
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.Apply); err != nil || len(changes) != 0 {
		t.Fatalf("apply again: %v %v", changes, err)
	}

	cfg := s.CachedInfo().Config
	cfg.RePublish = &jetstream.RePublish{Source: ">", Destination: "movebucket.config.>"}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []events.StreamMode{events.CreateMissing, events.Apply, events.DryRun} {
		var sc *events.StreamConflictError
		if _, _, err := SyncReplicasBucket(ctx, js, want, mode); !errors.As(err, &sc) || sc.Field != "republish" {
			t.Errorf("mode %d: %v, want a conflict on republish", mode, err)
		}
	}
	// A running replica's check reports it (error line, heartbeat
	// warning, readiness) while it lasts.
	var w routeWatch
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	w.check(ctx, js, names, log)
	if err := w.ready(); err == nil || !strings.Contains(err.Error(), "republish") || len(w.warnings()) != 1 || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("route check: ready %v, warnings %v, log %s", w.ready(), w.warnings(), logs)
	}
	cfg.RePublish = nil
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	w.last = w.last.Add(-2 * routeCheckEvery)
	w.check(ctx, js, names, log)
	if err := w.ready(); err != nil || len(w.warnings()) != 0 {
		t.Fatalf("after the republish went: ready %v, warnings %v", err, w.warnings())
	}
}
