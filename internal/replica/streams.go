package replica

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/events"
)

// DefaultUnresponsiveFor is how long the heartbeat of a replica that
// stopped beating without removing it (frozen, killed, cut off from NATS)
// stays in the replicas bucket, where `status` shows the replica as
// unresponsive with its last beat, before the bucket drops it. A replica
// counts as live only while its beats are younger than three heartbeats
// (Membership).
const DefaultUnresponsiveFor = 5 * time.Minute

// ReplicasBucketConfig is the stream of the replicas KV bucket: one
// heartbeat per replica, dropped dropAfter after its last write
// (DefaultUnresponsiveFor in deployments). It is the stream the NATS
// client makes for a bucket but for two settings, which is why it is
// created as a stream rather than through the client's bucket calls:
//
//   - Rollups are not allowed. A publish with a rollup header purges the
//     whole stream (Nats-Rollup: all), so a replica whose NATS user may
//     write only its own heartbeat could remove every other one with a
//     write on its own key. No reader needs them: a replica removes its
//     heartbeat with a delete, which is a publish like any other.
//   - No marker is written when a heartbeat expires: the server allows
//     such markers only with rollups. Readers do not need one: a replica
//     stops counting another as live three heartbeats after its last
//     beat, long before the bucket drops it (Membership).
//
// It is kept on file: after a restart of every NATS node it is still
// there, so no replica ever needs to create it (`cronstream streams
// apply` does).
func ReplicasBucketConfig(names events.Names, replicas int, dropAfter time.Duration) jetstream.StreamConfig {
	if replicas <= 0 {
		replicas = 1
	}
	// At least a second, so the duplicate window (at least 100 ms, and
	// within the age) always fits.
	dropAfter = max(dropAfter, time.Second)
	return jetstream.StreamConfig{
		Name:              names.ReplicasStream(),
		Description:       "cronstream replicas (heartbeats)",
		Subjects:          []string{names.ReplicasFilter()},
		MaxMsgsPerSubject: 1,
		MaxAge:            dropAfter,
		// The NATS client's values for a bucket: its duplicate window is
		// at most two minutes and never longer than the keys are kept.
		Duplicates:   min(2*time.Minute, dropAfter),
		MaxMsgs:      -1,
		MaxBytes:     -1,
		MaxMsgSize:   -1,
		MaxConsumers: -1,
		Discard:      jetstream.DiscardNew,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
		DenyDelete:   true,
		AllowRollup:  false,
		AllowDirect:  true,
	}
}

// SyncReplicasBucket brings the replicas bucket's stream towards want
// (ReplicasBucketConfig) as mode allows, like events.SyncStreams, and
// returns the bucket (nil in DryRun when it does not exist) and the
// differences found. A bucket on another storage (one kept in memory by
// earlier builds) is deleted and created again in Apply mode: the storage
// of a stream cannot change in place, and heartbeats are written again
// within a heartbeat. A bucket that allows rollups (every one made by
// earlier builds, through the NATS client's bucket calls) is changed in
// place to refuse them and write no expiry markers. A bucket with a way
// for messages to reach it or leave it other than a put
// (events.WriteRoute) is refused in every mode, as events.SyncStreams
// refuses such a stream.
func SyncReplicasBucket(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, mode events.StreamMode) (jetstream.KeyValue, []events.StreamChange, error) {
	bucket, ok := contract.BucketOfStream(want.Name)
	if !ok {
		return nil, nil, fmt.Errorf("replicas bucket: stream %s is not named as a bucket's", want.Name)
	}
	for pass := 0; ; pass++ {
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			created := []events.StreamChange{{Stream: want.Name, Field: "stream", Old: "missing", New: "created"}}
			if mode == events.DryRun {
				return nil, created, nil
			}
			_, err = js.CreateStream(ctx, want)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && pass == 0 {
				continue // another replica created it meanwhile
			}
			if err != nil {
				return nil, nil, fmt.Errorf("create replicas bucket %s: %w", bucket, err)
			}
			kv, err := js.KeyValue(ctx, bucket)
			return kv, created, err
		}
		if err != nil {
			return nil, nil, fmt.Errorf("replicas bucket %s: %w", bucket, err)
		}
		have := s.CachedInfo().Config
		if err := replicasBucketConflict(have, want); err != nil {
			return nil, nil, err
		}
		changes := replicasBucketChanges(have, want)
		if len(changes) > 0 && mode == events.Apply {
			if err := updateReplicasBucket(ctx, js, have, want); err != nil {
				return nil, nil, err
			}
		}
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, nil, fmt.Errorf("replicas bucket %s: %w", bucket, err)
		}
		return kv, changes, nil
	}
}

// replicasBucketConflict refuses an existing bucket stream that an update
// cannot or must not make ours: a write route, other subjects.
func replicasBucketConflict(have, want jetstream.StreamConfig) error {
	if route := events.WriteRoute(have); route != "" {
		field, value, _ := strings.Cut(route, " ")
		return &events.StreamConflictError{Stream: want.Name, Field: field, Existing: value, Wanted: "none"}
	}
	if subjects, wanted := strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","); subjects != wanted {
		return &events.StreamConflictError{Stream: want.Name, Field: "subjects", Existing: subjects, Wanted: wanted}
	}
	return nil
}

// replicasBucketChanges lists the settings of the bucket's stream that
// SyncReplicasBucket owns and that differ from want.
func replicasBucketChanges(have, want jetstream.StreamConfig) []events.StreamChange {
	var changes []events.StreamChange
	differ := func(field string, old, wanted any) {
		if old != wanted {
			changes = append(changes, events.StreamChange{Stream: want.Name, Field: field, Old: fmt.Sprint(old), New: fmt.Sprint(wanted)})
		}
	}
	differ("storage", have.Storage, want.Storage)
	differ("replicas", have.Replicas, want.Replicas)
	differ("ttl", have.MaxAge, want.MaxAge)
	differ("allow_rollup_hdrs", have.AllowRollup, want.AllowRollup)
	differ("limit_marker_ttl", have.SubjectDeleteMarkerTTL, want.SubjectDeleteMarkerTTL)
	return changes
}

// updateReplicasBucket makes the existing bucket stream have want: in
// place, or, for another storage, by deleting and creating it again.
func updateReplicasBucket(ctx context.Context, js jetstream.JetStream, have, want jetstream.StreamConfig) error {
	if have.Storage != want.Storage {
		if err := js.DeleteStream(ctx, want.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("move replicas bucket %s to %s storage: delete: %w", want.Name, want.Storage, err)
		}
		if _, err := js.CreateStream(ctx, want); err != nil {
			return fmt.Errorf("move replicas bucket %s to %s storage: create: %w", want.Name, want.Storage, err)
		}
		return nil
	}
	next := want
	// The server cannot switch these back once on. Message TTLs (on with
	// the expiry markers of earlier builds) then only let a writer make
	// its own heartbeat expire sooner.
	next.AllowMsgTTL = have.AllowMsgTTL
	next.DenyPurge = have.DenyPurge
	next.Placement, next.Metadata = have.Placement, have.Metadata
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("update replicas bucket %s: %w", want.Name, err)
	}
	return nil
}

// openStreams creates the config and activity streams and the replicas
// bucket when they do not exist (a first start without NATS permissions,
// `dev`) and never changes existing ones: their settings are `cronstream
// streams apply`'s, so one replica started with other flags cannot rewrite
// what every replica shares. A NATS user that may not create them (the
// replica role of deploy/nats/permissions.conf) makes the replica wait for
// `streams apply` instead, not ready, saying so. Each difference between
// this replica's flags and what exists is one warning, logged and returned
// for the heartbeat, where `status` shows it.
func (r *Replica) openStreams(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, []string, error) {
	var warnings []string
	note := func(changes []events.StreamChange) {
		for _, c := range changes {
			if c.Field == "stream" {
				r.log.Info("created stream", "stream", c.Stream)
				continue
			}
			w, special := streamWarning(r.cfg.Names, c)
			msg := "stream settings differ from this replica's flags"
			if special {
				msg = w
			}
			r.log.Warn(msg, "stream", c.Stream, "field", c.Field, "stream_value", c.Old, "flag_value", c.New)
			warnings = append(warnings, w)
		}
	}
	streams := events.StreamConfig{Names: r.cfg.Names, Replicas: r.cfg.StreamReplicas, ActivityMaxAge: r.cfg.ActivityMaxAge, DuplicateWindow: r.cfg.DuplicateWindow}
	mode := events.CreateMissing
	if err := r.retry(ctx, "ensure streams", func(ctx context.Context) error {
		changes, err := events.SyncStreams(ctx, js, streams, mode)
		if err == nil && mode == events.DryRun && len(changes) > 0 && changes[len(changes)-1].Field == "stream" {
			err = fmt.Errorf("stream %s is missing and this replica may not create it: waiting for `cronstream streams apply`", changes[len(changes)-1].Stream)
		}
		if next := r.createOrWait(mode, err); next != mode {
			mode = next
			return errMayNotCreate
		}
		if err == nil {
			note(changes)
		}
		return err
	}); err != nil {
		return nil, nil, err
	}
	var kv jetstream.KeyValue
	mode = events.CreateMissing
	if err := r.retry(ctx, "replicas bucket", func(ctx context.Context) error {
		var changes []events.StreamChange
		var err error
		kv, changes, err = SyncReplicasBucket(ctx, js, ReplicasBucketConfig(r.cfg.Names, r.cfg.StreamReplicas, r.unresponsiveFor()), mode)
		if err == nil && kv == nil {
			err = fmt.Errorf("replicas bucket %s is missing and this replica may not create it: waiting for `cronstream streams apply`", r.cfg.Names.ReplicasBucket())
		}
		if next := r.createOrWait(mode, err); next != mode {
			mode = next
			return errMayNotCreate
		}
		if err == nil {
			note(changes)
		}
		return err
	}); err != nil {
		return nil, nil, err
	}
	return kv, warnings, nil
}

// errMayNotCreate is what a start that may not create a missing stream
// waits on.
var errMayNotCreate = errors.New("a stream or the replicas bucket is missing and this replica may not create it (NATS permissions): waiting for `cronstream streams apply`")

// createOrWait is the mode of the next attempt to open the streams after
// err: a refused create (the NATS user may not create streams) turns
// creating into looking, once, and is logged, so the replica waits for
// `cronstream streams apply` instead of ending; any other error is left
// to the retry.
func (r *Replica) createOrWait(mode events.StreamMode, err error) events.StreamMode {
	if mode == events.CreateMissing && errors.Is(err, nats.ErrPermissionViolation) ||
		mode == events.CreateMissing && r.nc != nil && errors.Is(r.nc.LastError(), nats.ErrPermissionViolation) && strings.Contains(r.nc.LastError().Error(), ".CREATE.") {
		r.log.Warn("not ready: a stream is missing and this replica may not create it (NATS permissions): waiting for `cronstream streams apply`", "err", err)
		return events.DryRun
	}
	return mode
}

// streamWarning says what a difference between an existing stream and
// this replica's settings means; special when it is not a flag's.
func streamWarning(names events.Names, c events.StreamChange) (w string, special bool) {
	switch {
	case c.Field == "subjects" && c.Stream == names.ConfigStream():
		return fmt.Sprintf("stream %s does not capture %s: this replica cannot pause entries on failure (pause_on_failure) until `cronstream streams apply` adds it", c.Stream, names.FailPauseFilter()), true
	case c.Field == "storage" && c.Stream == names.ReplicasStream():
		return fmt.Sprintf("replicas bucket %s is kept in %s: a restart of every NATS node loses it, and replicas then wait until `cronstream streams apply` makes it again; run `cronstream streams apply` to move it to file storage", names.ReplicasBucket(), c.Old), true
	case c.Field == "allow_rollup_hdrs" && c.Stream == names.ReplicasStream():
		return fmt.Sprintf("replicas bucket %s allows rollups: a replica's NATS user, which may write only its own heartbeat, can remove every other replica's with one write; run `cronstream streams apply` to refuse them", names.ReplicasBucket()), true
	case c.Field == "limit_marker_ttl" && c.Stream == names.ReplicasStream():
		return fmt.Sprintf("replicas bucket %s writes a marker when a heartbeat expires, which the server allows only with rollups; run `cronstream streams apply` to stop it", names.ReplicasBucket()), true
	}
	return fmt.Sprintf("stream %s: %s is %s, this replica's flags say %s; left unchanged (`cronstream streams apply` changes it)", c.Stream, c.Field, c.Old, c.New), false
}
