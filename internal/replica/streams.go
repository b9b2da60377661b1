package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// ReplicasBucketConfig is the replicas KV bucket: heartbeats that expire
// after ttl unless refreshed, with a marker at expiry so watchers learn of
// it.
func ReplicasBucketConfig(names events.Names, replicas int, ttl time.Duration) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	// The server refuses expiry markers kept for less than a second.
	ttl = max(ttl, time.Second)
	return jetstream.KeyValueConfig{
		Bucket:         names.ReplicasBucket(),
		Description:    "cronstream live replicas (heartbeats)",
		History:        1,
		TTL:            ttl,
		LimitMarkerTTL: ttl,
		Storage:        jetstream.MemoryStorage,
		Replicas:       replicas,
	}
}

// SyncReplicasBucket brings the replicas bucket towards want as mode
// allows, like events.SyncStreams, and returns the bucket (nil in DryRun
// when it does not exist) and the differences found.
func SyncReplicasBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig, mode events.StreamMode) (jetstream.KeyValue, []events.StreamChange, error) {
	stream := "KV_" + want.Bucket
	for pass := 0; ; pass++ {
		kv, err := js.KeyValue(ctx, want.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			created := []events.StreamChange{{Stream: stream, Field: "stream", Old: "missing", New: "created"}}
			if mode == events.DryRun {
				return nil, created, nil
			}
			kv, err = js.CreateKeyValue(ctx, want)
			if errors.Is(err, jetstream.ErrBucketExists) && pass == 0 {
				continue // another replica created it meanwhile
			}
			if err != nil {
				return nil, nil, fmt.Errorf("create replicas bucket %s: %w", want.Bucket, err)
			}
			return kv, created, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("replicas bucket %s: %w", want.Bucket, err)
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, nil, fmt.Errorf("replicas bucket %s: %w", want.Bucket, err)
		}
		have := s.CachedInfo().Config
		var changes []events.StreamChange
		differ := func(field string, old, wanted any) {
			if old != wanted {
				changes = append(changes, events.StreamChange{Stream: stream, Field: field, Old: fmt.Sprint(old), New: fmt.Sprint(wanted)})
			}
		}
		differ("replicas", have.Replicas, want.Replicas)
		differ("ttl", have.MaxAge, want.TTL)
		differ("limit_marker_ttl", have.SubjectDeleteMarkerTTL, want.LimitMarkerTTL)
		if len(changes) == 0 || mode != events.Apply {
			return kv, changes, nil
		}
		if kv, err = js.UpdateKeyValue(ctx, want); err != nil {
			return nil, nil, fmt.Errorf("update replicas bucket %s: %w", want.Bucket, err)
		}
		return kv, changes, nil
	}
}

// openStreams creates the config and activity streams and the replicas
// bucket when they do not exist (a first start, `dev`) and never changes
// existing ones: their settings are `cronstream streams apply`'s, so one
// replica started with other flags cannot rewrite what every replica
// shares. Each difference between this replica's flags and what exists is
// one warning, logged and returned for the heartbeat, where `status` shows
// it.
func (r *Replica) openStreams(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, []string, error) {
	var warnings []string
	note := func(changes []events.StreamChange) {
		for _, c := range changes {
			if c.Field == "stream" {
				r.log.Info("created stream", "stream", c.Stream)
				continue
			}
			w := fmt.Sprintf("stream %s: %s is %s, this replica's flags say %s; left unchanged (`cronstream streams apply` changes it)", c.Stream, c.Field, c.Old, c.New)
			r.log.Warn("stream settings differ from this replica's flags", "stream", c.Stream, "field", c.Field, "stream_value", c.Old, "flag_value", c.New)
			warnings = append(warnings, w)
		}
	}
	streams := events.StreamConfig{Names: r.cfg.Names, Replicas: r.cfg.StreamReplicas, ActivityMaxAge: r.cfg.ActivityMaxAge, DuplicateWindow: r.cfg.DuplicateWindow}
	if err := r.retry(ctx, "ensure streams", func(ctx context.Context) error {
		changes, err := events.SyncStreams(ctx, js, streams, events.CreateMissing)
		if err == nil {
			note(changes)
		}
		return err
	}); err != nil {
		return nil, nil, err
	}
	var kv jetstream.KeyValue
	if err := r.retry(ctx, "replicas bucket", func(ctx context.Context) error {
		var changes []events.StreamChange
		var err error
		kv, changes, err = SyncReplicasBucket(ctx, js, ReplicasBucketConfig(r.cfg.Names, r.cfg.StreamReplicas, 3*r.cfg.Heartbeat), events.CreateMissing)
		if err == nil {
			note(changes)
		}
		return err
	}); err != nil {
		return nil, nil, err
	}
	return kv, warnings, nil
}
