package streamclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

// Stream defaults.
const (
	// DefaultActivityMaxAge is how long activity events are kept.
	DefaultActivityMaxAge = 30 * 24 * time.Hour
	// DefaultDuplicateWindow is the activity stream's Nats-Msg-Id window. An
	// hour covers a relay that restarts, waits out a NATS outage of many
	// minutes and republishes its outbox; the cost is one dedupe entry per
	// event of the last hour in the server's memory.
	DefaultDuplicateWindow = time.Hour
	// MinDuplicateWindow is the shortest window EnsureStreams accepts: below
	// it a relay restart could republish outside the window and write an
	// activity event twice.
	MinDuplicateWindow = 10 * time.Minute
	// maxReplicas is JetStream's limit.
	maxReplicas = 5
)

// ErrStreamConflict is wrapped by the error EnsureStreams returns when an
// existing stream cannot be brought to the wanted configuration without
// changing what it is (its subjects, storage, retention, or the guarantees
// of the audit log).
var ErrStreamConflict = errors.New("stream conflicts with the wanted configuration")

// StreamConflictError names the stream and the field that conflict.
type StreamConflictError struct {
	Stream   string
	Field    string
	Existing string
	Wanted   string
}

func (e *StreamConflictError) Error() string {
	return fmt.Sprintf("stream %s: %s is %s, want %s; it cannot be changed in place: fix or remove the stream by hand (or use another prefix)",
		e.Stream, e.Field, e.Existing, e.Wanted)
}

// Unwrap makes errors.Is(err, ErrStreamConflict) true.
func (e *StreamConflictError) Unwrap() error { return ErrStreamConflict }

// StreamConfig is what EnsureStreams makes. Zero values mean the defaults.
type StreamConfig struct {
	// Names gives the stream names and subjects (zero value: the default
	// prefix).
	Names contract.Names
	// Replicas of both streams: 1 (the default) for development, 3 for
	// production.
	Replicas int
	// ActivityMaxAge is how long activity events are kept (default 30 days).
	ActivityMaxAge time.Duration
	// DuplicateWindow is the activity stream's deduplication window
	// (default 1h, at least 10m, at most ActivityMaxAge).
	DuplicateWindow time.Duration
}

func (c StreamConfig) withDefaults() (StreamConfig, error) {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.ActivityMaxAge == 0 {
		c.ActivityMaxAge = DefaultActivityMaxAge
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	switch {
	case c.Replicas < 1 || c.Replicas > maxReplicas:
		return c, fmt.Errorf("stream replicas %d: must be between 1 and %d", c.Replicas, maxReplicas)
	case c.ActivityMaxAge < 0:
		return c, fmt.Errorf("activity max age %s: must not be negative", c.ActivityMaxAge)
	case c.DuplicateWindow < MinDuplicateWindow:
		return c, fmt.Errorf("duplicate window %s: must be at least %s so a relay restart cannot write an event twice", c.DuplicateWindow, MinDuplicateWindow)
	case c.DuplicateWindow > c.ActivityMaxAge:
		return c, fmt.Errorf("activity max age %s is below the duplicate window %s: a relay could republish an event the stream no longer remembers, and write it twice", c.ActivityMaxAge, c.DuplicateWindow)
	}
	return c, nil
}

// ConfigStreamConfig is the JetStream configuration of <P>_CONFIG: an audit
// log that cannot be rewritten (no age or count limit, no delete, no
// purge), every revision of every entry kept, cheap direct reads. Its
// duplicate window stays the server's default (2m): config writes retry
// within seconds, and a retry after the window is still resolved by the
// expected-sequence check and the client's read of the subject.
func (c StreamConfig) ConfigStreamConfig() (jetstream.StreamConfig, error) {
	c, err := c.withDefaults()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	return jetstream.StreamConfig{
		Name:              c.Names.ConfigStream(),
		Description:       "cronstream configuration events (audit log: no delete, no purge)",
		Subjects:          c.Names.ConfigStreamSubjects(),
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		MaxAge:            0,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		Discard:           jetstream.DiscardOld,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowDirect:       true,
	}, nil
}

// ActivityStreamConfig is the JetStream configuration of <P>_ACTIVITY.
func (c StreamConfig) ActivityStreamConfig() (jetstream.StreamConfig, error) {
	c, err := c.withDefaults()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	return jetstream.StreamConfig{
		Name:        c.Names.ActivityStream(),
		Description: "cronstream activity events: fires, skips, recoveries",
		Subjects:    c.Names.ActivitySubjects(),
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxAge:      c.ActivityMaxAge,
		Duplicates:  c.DuplicateWindow,
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}, nil
}

// StreamChange is one difference between an existing stream (or KV
// bucket) and the wanted configuration, or a stream to create.
type StreamChange struct {
	Stream string `json:"stream"`
	// Field is the setting ("replicas", "max_age", ...), or "stream" for a
	// stream that does not exist (Old "missing", New "created").
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

func (c StreamChange) String() string {
	if c.Field == "stream" {
		return fmt.Sprintf("%s: %s → %s", c.Stream, c.Old, c.New)
	}
	return fmt.Sprintf("%s %s: %s → %s", c.Stream, c.Field, c.Old, c.New)
}

// StreamMode says what a stream step may change.
type StreamMode int

const (
	// CreateMissing creates a stream that does not exist and leaves an
	// existing one as it is, reporting its differences: what a replica
	// does at start, so one misconfigured replica cannot rewrite the
	// streams every replica shares.
	CreateMissing StreamMode = iota
	// Apply creates or updates to the wanted configuration (`cronstream
	// streams apply`).
	Apply
	// DryRun reports what Apply would change and changes nothing.
	DryRun
)

// EnsureStreams creates <P>_CONFIG and <P>_ACTIVITY, or updates them to cfg:
// SyncStreams in Apply mode.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	_, err := SyncStreams(ctx, js, cfg, Apply)
	return err
}

// SyncStreams brings <P>_CONFIG and <P>_ACTIVITY towards cfg as mode allows
// and returns the differences it found: streams created (or to create) and
// settings changed (Apply), to change (DryRun) or left different
// (CreateMissing). It is idempotent: when both streams match, it changes
// nothing and returns none. It owns only some fields (replicas, limits,
// duplicate window, direct reads) and keeps everything else an operator set
// (description, placement, metadata). An existing stream that differs in
// what cannot or must not be changed in place — subjects, storage,
// retention, a config stream that allows deletes, purges or message TTLs, a
// sealed stream, and a way for messages to reach it other than a publish
// (a mirror, sources, a subject transform) or to leave it for other
// subjects (a republish) — is left alone and reported as a
// *StreamConflictError. The one change of subjects it makes is adding the
// fail-pause subjects to a config stream made before them.
func SyncStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, mode StreamMode) ([]StreamChange, error) {
	configCfg, err := cfg.ConfigStreamConfig()
	if err != nil {
		return nil, err
	}
	activityCfg, err := cfg.ActivityStreamConfig()
	if err != nil {
		return nil, err
	}
	changes, err := syncStream(ctx, js, configCfg, true, mode)
	if err != nil {
		return changes, err
	}
	more, err := syncStream(ctx, js, activityCfg, false, mode)
	return append(changes, more...), err
}

func syncStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, auditLog bool, mode StreamMode) ([]StreamChange, error) {
	// Two passes at most: when several replicas start together, another one
	// may create the stream between our lookup and our create.
	for pass := 0; ; pass++ {
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			created := []StreamChange{{Stream: want.Name, Field: "stream", Old: "missing", New: "created"}}
			if mode == DryRun {
				return created, nil
			}
			_, err = js.CreateStream(ctx, want)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && pass == 0 {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
			}
			return created, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
		}
		have := s.CachedInfo().Config
		if err := checkStreamConflicts(have, want, auditLog); err != nil {
			return nil, err
		}
		next, changes := reconcileStream(have, want, auditLog)
		if len(changes) == 0 || mode != Apply {
			return changes, nil
		}
		if _, err := js.UpdateStream(ctx, next); err != nil {
			return nil, fmt.Errorf("update stream %s: %w", want.Name, err)
		}
		return changes, nil
	}
}

// checkStreamConflicts refuses an existing stream that is not the stream
// we would have made, in a way an update cannot or must not fix.
func checkStreamConflicts(have, want jetstream.StreamConfig, auditLog bool) error {
	conflict := func(field string, existing, wanted any) error {
		return &StreamConflictError{Stream: want.Name, Field: field, Existing: fmt.Sprint(existing), Wanted: fmt.Sprint(wanted)}
	}
	// A write route first: a mirror has no subjects of its own, and is
	// named as what it is rather than as subjects that differ.
	if route := WriteRoute(have); route != "" {
		field, value, _ := strings.Cut(route, " ")
		return conflict(field, value, "none")
	}
	haveSubjects, wantSubjects := slices.Sorted(slices.Values(have.Subjects)), slices.Sorted(slices.Values(want.Subjects))
	if !slices.Equal(haveSubjects, wantSubjects) && !(auditLog && missingFailPause(have, want)) {
		return conflict("subjects", haveSubjects, wantSubjects)
	}
	switch {
	case have.Storage != want.Storage:
		return conflict("storage", have.Storage, want.Storage)
	case have.Retention != want.Retention:
		return conflict("retention", have.Retention, want.Retention)
	case have.Sealed:
		return conflict("sealed", true, false)
	case have.AllowMsgCounter:
		return conflict("allow_msg_counter", true, false)
	}
	if auditLog {
		// The server could turn these on, but a config stream that ever
		// allowed deletes or purges may already have lost history; hiding
		// that by switching them on would make the audit log lie.
		switch {
		case !have.DenyDelete:
			return conflict("deny_delete", false, true)
		case !have.DenyPurge:
			return conflict("deny_purge", false, true)
		case have.AllowMsgTTL:
			// Per-message TTLs would let a publisher make history expire,
			// and the server cannot switch them off again.
			return conflict("allow_msg_ttl", true, false)
		}
	}
	return nil
}

// reconcileStream returns have with the fields we own set as in want, and
// what differs. Limits of zero and -1 both mean unlimited.
func reconcileStream(have, want jetstream.StreamConfig, auditLog bool) (jetstream.StreamConfig, []StreamChange) {
	next := have
	var changes []StreamChange
	set := func(field string, differ bool, old, wanted any, apply func()) {
		if differ {
			apply()
			changes = append(changes, StreamChange{Stream: want.Name, Field: field, Old: fmt.Sprint(old), New: fmt.Sprint(wanted)})
		}
	}
	unlimited := func(v int64) bool { return v <= 0 }
	if auditLog && missingFailPause(have, want) {
		set("subjects", true, have.Subjects, want.Subjects, func() { next.Subjects = want.Subjects })
	}
	set("replicas", have.Replicas != want.Replicas, have.Replicas, want.Replicas, func() { next.Replicas = want.Replicas })
	set("max_age", have.MaxAge != want.MaxAge, fmtAge(have.MaxAge), fmtAge(want.MaxAge), func() { next.MaxAge = want.MaxAge })
	set("discard", have.Discard != want.Discard, have.Discard, want.Discard, func() { next.Discard = want.Discard })
	set("allow_direct", have.AllowDirect != want.AllowDirect, have.AllowDirect, want.AllowDirect, func() { next.AllowDirect = want.AllowDirect })
	if auditLog {
		set("max_msgs", !unlimited(have.MaxMsgs), have.MaxMsgs, "unlimited", func() { next.MaxMsgs = -1 })
		set("max_bytes", !unlimited(have.MaxBytes), have.MaxBytes, "unlimited", func() { next.MaxBytes = -1 })
		set("max_msgs_per_subject", !unlimited(have.MaxMsgsPerSubject), have.MaxMsgsPerSubject, "unlimited", func() { next.MaxMsgsPerSubject = -1 })
	} else {
		set("duplicate_window", have.Duplicates != want.Duplicates, have.Duplicates, want.Duplicates, func() { next.Duplicates = want.Duplicates })
	}
	return next, changes
}

// missingFailPause reports whether have is a config stream made before
// fail-pause requests: its subjects are want's but the fail-pause ones.
// Adding them is the one change of subjects SyncStreams makes; until then
// replicas cannot pause entries on failure (they say so).
func missingFailPause(have, want jetstream.StreamConfig) bool {
	return len(have.Subjects) == 1 && len(want.Subjects) == 2 && have.Subjects[0] == want.Subjects[0]
}

// WriteRoute names the first setting of an existing stream (or KV
// bucket) that makes the server write messages other than a client's
// publish on its subjects, into it or out of it: a mirror, sources or a
// subject transform bring other streams' messages (or other subjects) in,
// a republish copies its messages onto other subjects — a bucket that
// republishes onto a config subject writes configuration. cronstream
// makes none of them; "" when the stream has none. The form is "<field>
// <value>", e.g. "republish cronstream.config.>".
func WriteRoute(have jetstream.StreamConfig) string {
	switch {
	case have.Mirror != nil:
		return "mirror " + have.Mirror.Name
	case len(have.Sources) > 0:
		names := make([]string, len(have.Sources))
		for i, src := range have.Sources {
			names[i] = src.Name
		}
		return "sources " + strings.Join(names, ",")
	case have.RePublish != nil:
		return "republish " + have.RePublish.Source + "→" + have.RePublish.Destination
	case have.SubjectTransform != nil:
		return "subject_transform " + have.SubjectTransform.Source + "→" + have.SubjectTransform.Destination
	}
	return ""
}

// StreamWriteRoutes reads the config and activity streams and the
// replicas bucket and returns, for each that has one, its WriteRoute as
// "<stream>: <route>". A missing stream has none.
func StreamWriteRoutes(ctx context.Context, js jetstream.JetStream, names contract.Names) ([]string, error) {
	var out []string
	for _, name := range []string{names.ConfigStream(), names.ActivityStream(), names.ReplicasStream()} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", name, err)
		}
		if route := WriteRoute(s.CachedInfo().Config); route != "" {
			out = append(out, name+": "+route)
		}
	}
	return out, nil
}

// RepublishInto lists the other streams of the account that republish
// onto cronstream's subjects (<p>.> and the replicas bucket's), as
// "<stream>: republish <source>→<destination>": the server writes their
// messages there as if published, configuration included. Listing the
// streams needs $JS.API.STREAM.LIST.
func RepublishInto(ctx context.Context, js jetstream.JetStream, names contract.Names) ([]string, error) {
	ours := map[string]bool{names.ConfigStream(): true, names.ActivityStream(): true, names.ReplicasStream(): true}
	targets := []string{names.Prefix() + ".>", names.ReplicasFilter()}
	var out []string
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		rp := info.Config.RePublish
		if ours[info.Config.Name] || rp == nil {
			continue
		}
		for _, t := range targets {
			if filtersOverlap(rp.Destination, t) {
				out = append(out, info.Config.Name+": republish "+rp.Source+"→"+rp.Destination)
				break
			}
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// filtersOverlap reports whether some subject matches both NATS subject
// filters.
func filtersOverlap(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(at) && i < len(bt); i++ {
		switch {
		case at[i] == ">" || bt[i] == ">":
			return true
		case at[i] == "*" || bt[i] == "*" || at[i] == bt[i]:
		default:
			return false
		}
	}
	return len(at) == len(bt)
}

// fmtAge shows a stream's max age; zero keeps messages forever.
func fmtAge(d time.Duration) string {
	if d == 0 {
		return "unlimited"
	}
	return d.String()
}
