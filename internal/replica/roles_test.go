package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

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
// again), keeping its name and settings; a bucket with a republish, or
// made as a mirror, is refused in every mode, naming the route.
func TestReplicasBucketMovedToFile(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := context.Background()
	names := events.MustNames("movebucket")
	earlierBuildBucket(t, js, names, jetstream.MemoryStorage)
	want := ReplicasBucketConfig(names, 1, DefaultUnresponsiveFor)
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.CreateMissing); err != nil || len(changes) != 3 || changes[0].Field != "storage" {
		t.Fatalf("a replica's look: %v %v", changes, err)
	}
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.Apply); err != nil || len(changes) != 3 {
		t.Fatalf("apply: %v %v", changes, err)
	}
	s, err := js.Stream(ctx, names.ReplicasStream())
	if err != nil || s.CachedInfo().Config.Storage != jetstream.FileStorage || s.CachedInfo().Config.AllowRollup {
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
	mirrored := events.MustNames("mirrorbucket")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: mirrored.ReplicasStream(), Mirror: &jetstream.StreamSource{Name: names.ReplicasStream()}}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []events.StreamMode{events.CreateMissing, events.Apply, events.DryRun} {
		var sc *events.StreamConflictError
		if _, _, err := SyncReplicasBucket(ctx, js, ReplicasBucketConfig(mirrored, 1, DefaultUnresponsiveFor), mode); !errors.As(err, &sc) || sc.Field != "mirror" {
			t.Errorf("mode %d: %v, want a conflict on mirror", mode, err)
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

// earlierBuildBucket makes the replicas bucket as builds before this one
// did, through the NATS client's bucket calls: rollups allowed, a marker
// when a heartbeat expires.
func earlierBuildBucket(t *testing.T, js jetstream.JetStream, names events.Names, storage jetstream.StorageType) {
	t.Helper()
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: names.ReplicasBucket(), Description: "cronstream replicas (heartbeats)",
		History: 1, TTL: DefaultUnresponsiveFor, LimitMarkerTTL: DefaultUnresponsiveFor, Storage: storage, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestReplicasBucketRollupsRefused: a bucket made by an earlier build
// allows rollups, with which a write on one key purges every heartbeat.
// A replica reports it (two warnings, one per setting, the bucket left as
// it is); `streams apply` changes it in place, keeping its heartbeats,
// to refuse rollups and write no expiry markers, as the bucket it makes
// does. Afterwards a rollup on one key is refused and removes nothing,
// while puts, reads and a stopping replica's delete work as before.
func TestReplicasBucketRollupsRefused(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := testenv.Context(t, 30*time.Second)
	names := events.MustNames("rollup")
	earlierBuildBucket(t, js, names, jetstream.FileStorage)
	want := ReplicasBucketConfig(names, 1, DefaultUnresponsiveFor)
	kv, changes, err := SyncReplicasBucket(ctx, js, want, events.CreateMissing)
	if err != nil || len(changes) != 2 || changes[0].Field != "allow_rollup_hdrs" || changes[1].Field != "limit_marker_ttl" {
		t.Fatalf("a replica's look: %v %v", changes, err)
	}
	for _, c := range changes {
		if w, special := streamWarning(names, c); !special || !strings.Contains(w, "streams apply") {
			t.Errorf("warning for %s: %q", c.Field, w)
		}
	}
	if _, err := kv.Put(ctx, "b", []byte(`{"id":"b"}`)); err != nil {
		t.Fatal(err)
	}
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.DryRun); err != nil || len(changes) != 2 {
		t.Fatalf("dry run: %v %v", changes, err)
	}
	if kv, changes, err = SyncReplicasBucket(ctx, js, want, events.Apply); err != nil || len(changes) != 2 {
		t.Fatalf("apply: %v %v", changes, err)
	}
	s, err := js.Stream(ctx, names.ReplicasStream())
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.AllowRollup || cfg.SubjectDeleteMarkerTTL != 0 || cfg.MaxAge != DefaultUnresponsiveFor {
		t.Fatalf("after apply: rollups %t, marker ttl %s, max age %s", cfg.AllowRollup, cfg.SubjectDeleteMarkerTTL, cfg.MaxAge)
	}
	if _, changes, err := SyncReplicasBucket(ctx, js, want, events.Apply); err != nil || len(changes) != 0 {
		t.Fatalf("apply again: %v %v", changes, err)
	}

	// The bucket as `streams apply` made it, and a new one as it makes it.
	fresh := events.MustNames("rollupnew")
	kvNew, changes, err := SyncReplicasBucket(ctx, js, ReplicasBucketConfig(fresh, 1, DefaultUnresponsiveFor), events.Apply)
	if err != nil || len(changes) != 1 || changes[0].Field != "stream" {
		t.Fatalf("create: %v %v", changes, err)
	}
	if _, err := kvNew.Put(ctx, "b", []byte(`{"id":"b"}`)); err != nil {
		t.Fatal(err)
	}
	for bucket, kv := range map[string]jetstream.KeyValue{"updated": kv, "new": kvNew} {
		for _, rollup := range []string{jetstream.MsgRollupAll, jetstream.MsgRollupSubject} {
			h := nats.Header{}
			h.Set(jetstream.MsgRollup, rollup)
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + kv.Bucket() + ".a", Header: h, Data: []byte(`{"id":"a"}`)}); err == nil {
				t.Errorf("%s bucket: a rollup %q was stored", bucket, rollup)
			}
		}
		if e, err := kv.Get(ctx, "b"); err != nil || string(e.Value()) != `{"id":"b"}` {
			t.Errorf("%s bucket: b's heartbeat after the rollups: %v %v", bucket, e, err)
		}
		if _, err := kv.Put(ctx, "a", []byte(`{"id":"a"}`)); err != nil {
			t.Errorf("%s bucket: put: %v", bucket, err)
		}
		if err := kv.Delete(ctx, "a"); err != nil {
			t.Errorf("%s bucket: delete: %v", bucket, err)
		}
		if keys, err := kv.Keys(ctx); err != nil || !slices.Equal(keys, []string{"b"}) {
			t.Errorf("%s bucket: keys %v %v, want b", bucket, keys, err)
		}
	}
}
