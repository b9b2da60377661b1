package streamclient

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/testenv"
)

// tracedJetStream returns a JetStream handle that records the API subjects
// it requests.
func tracedJetStream(t *testing.T, n *testenv.NATS) (jetstream.JetStream, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var subjects []string
	js, err := jetstream.New(n.Connect(t), jetstream.WithClientTrace(&jetstream.ClientTrace{
		RequestSent: func(subj string, _ []byte) {
			mu.Lock()
			subjects = append(subjects, subj)
			mu.Unlock()
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	return js, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := subjects
		subjects = nil
		return out
	}
}

func TestEnsureStreamsCreatesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n := testenv.StartNATS(t)
	js, requests := tracedJetStream(t, n)
	cfg := StreamConfig{Names: contract.MustNames("tenant-a"), ActivityMaxAge: 7 * 24 * time.Hour, DuplicateWindow: 20 * time.Minute}
	if err := EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	created := strings.Join(requests(), " ")
	if strings.Count(created, "STREAM.CREATE.") != 2 {
		t.Fatalf("first call requested %s, want two creates", created)
	}

	s, err := js.Stream(ctx, "TENANT_A_CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if !c.DenyDelete || !c.DenyPurge || !c.AllowDirect || c.Storage != jetstream.FileStorage || c.MaxAge != 0 ||
		c.MaxMsgsPerSubject > 0 || c.MaxMsgs > 0 || c.MaxBytes > 0 || c.Discard != jetstream.DiscardOld ||
		c.Replicas != 1 || strings.Join(c.Subjects, ",") != "tenant-a.config.>,tenant-a.failpause.>" {
		t.Fatalf("config stream config: %+v", c)
	}
	s, err = js.Stream(ctx, "TENANT_A_ACTIVITY")
	if err != nil {
		t.Fatal(err)
	}
	a := s.CachedInfo().Config
	if a.MaxAge != 7*24*time.Hour || a.Duplicates != 20*time.Minute || a.Storage != jetstream.FileStorage ||
		strings.Join(a.Subjects, ",") != "tenant-a.fire.>,tenant-a.recovery.>" {
		t.Fatalf("activity stream config: %+v", a)
	}

	// Second call: looks, changes nothing.
	if err := EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, subj := range requests() {
		if !strings.Contains(subj, "STREAM.INFO.") {
			t.Errorf("second call requested %s; want only STREAM.INFO", subj)
		}
	}

	// A changed setting is applied in place; what an operator added stays.
	a.Metadata = map[string]string{"team": "platform"}
	if _, err := js.UpdateStream(ctx, a); err != nil {
		t.Fatal(err)
	}
	requests()
	cfg.ActivityMaxAge = 14 * 24 * time.Hour
	if err := EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(requests(), " "); strings.Count(got, "STREAM.UPDATE.TENANT_A_ACTIVITY") != 1 || strings.Contains(got, "UPDATE.TENANT_A_CONFIG") {
		t.Fatalf("requests %s, want the activity stream updated", got)
	}
	s, _ = js.Stream(ctx, "TENANT_A_ACTIVITY")
	if a := s.CachedInfo().Config; a.MaxAge != 14*24*time.Hour || a.Metadata["team"] != "platform" {
		t.Fatalf("after update: max age %s metadata %v", a.MaxAge, a.Metadata)
	}
}

func TestConfigStreamRefusesDeleteAndPurge(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "audit")
	r, err := c.Put(ctx, validEntry("job"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "AUDIT_CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, r.Revision); err == nil {
		t.Fatal("delete of a config event succeeded")
	}
	if err := s.SecureDeleteMsg(ctx, r.Revision); err == nil {
		t.Fatal("secure delete of a config event succeeded")
	}
	if err := s.Purge(ctx); err == nil {
		t.Fatal("purge of the config stream succeeded")
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject("audit.config.job")); err == nil {
		t.Fatal("subject purge of the config stream succeeded")
	}
	// Nor can the guarantees be switched off.
	cfg := s.CachedInfo().Config
	cfg.DenyDelete = false
	if _, err := js.UpdateStream(ctx, cfg); err == nil {
		t.Fatal("turning deny_delete off succeeded")
	}
	if _, rev, err := c.Get(ctx, "job"); err != nil || rev != r.Revision {
		t.Fatalf("entry after refused deletes: rev %d err %v", rev, err)
	}
}

func TestEnsureStreamsConflicts(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	cases := []struct {
		name   string
		prefix string
		stream jetstream.StreamConfig
		field  string
	}{
		{"config subjects", "subj", jetstream.StreamConfig{Name: "SUBJ_CONFIG", Subjects: []string{"other.>"}, DenyDelete: true, DenyPurge: true}, "subjects"},
		{"config storage", "mem", jetstream.StreamConfig{Name: "MEM_CONFIG", Subjects: []string{"mem.config.>"}, Storage: jetstream.MemoryStorage, DenyDelete: true, DenyPurge: true}, "storage"},
		{"config allows deletes", "del", jetstream.StreamConfig{Name: "DEL_CONFIG", Subjects: []string{"del.config.>"}, DenyPurge: true}, "deny_delete"},
		{"config allows purges", "purge", jetstream.StreamConfig{Name: "PURGE_CONFIG", Subjects: []string{"purge.config.>"}, DenyDelete: true}, "deny_purge"},
		{"config allows message TTLs", "ttl", jetstream.StreamConfig{Name: "TTL_CONFIG", Subjects: []string{"ttl.config.>"}, DenyDelete: true, DenyPurge: true, AllowMsgTTL: true}, "allow_msg_ttl"},
		{"config work queue", "wq", jetstream.StreamConfig{Name: "WQ_CONFIG", Subjects: []string{"wq.config.>"}, Retention: jetstream.WorkQueuePolicy, DenyDelete: true, DenyPurge: true}, "retention"},
		{"activity subjects", "act", jetstream.StreamConfig{Name: "ACT_ACTIVITY", Subjects: []string{"act.fire.>"}}, "subjects"},
		{"activity interest", "interest", jetstream.StreamConfig{Name: "INTEREST_ACTIVITY", Subjects: []string{"interest.fire.>", "interest.recovery.>"}, Retention: jetstream.InterestPolicy}, "retention"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			if _, err := js.CreateStream(ctx, tc.stream); err != nil {
				t.Fatal(err)
			}
			err := EnsureStreams(ctx, js, StreamConfig{Names: contract.MustNames(tc.prefix)})
			var sc *StreamConflictError
			if !errors.As(err, &sc) || !errors.Is(err, ErrStreamConflict) {
				t.Fatalf("EnsureStreams: %v, want a *StreamConflictError", err)
			}
			if sc.Stream != tc.stream.Name || sc.Field != tc.field {
				t.Fatalf("conflict names %s.%s, want %s.%s (%v)", sc.Stream, sc.Field, tc.stream.Name, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.stream.Name) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("message %q does not name stream and field", err)
			}
			// Nothing was changed.
			s, err := js.Stream(ctx, tc.stream.Name)
			if err != nil {
				t.Fatal(err)
			}
			got := s.CachedInfo().Config
			if strings.Join(got.Subjects, ",") != strings.Join(tc.stream.Subjects, ",") || got.DenyDelete != tc.stream.DenyDelete ||
				got.DenyPurge != tc.stream.DenyPurge || got.Retention != tc.stream.Retention || got.AllowDirect {
				t.Errorf("the conflicting stream was changed: %+v", got)
			}
		})
	}
}

func TestStreamConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  StreamConfig
		want string // "" for valid
	}{
		{StreamConfig{}, ""},
		{StreamConfig{Replicas: 3, ActivityMaxAge: time.Hour, DuplicateWindow: 10 * time.Minute}, ""},
		{StreamConfig{Replicas: 6}, "replicas"},
		{StreamConfig{Replicas: -1}, "replicas"},
		{StreamConfig{ActivityMaxAge: -time.Hour}, "max age"},
		{StreamConfig{DuplicateWindow: 5 * time.Minute}, "at least 10m"},
		{StreamConfig{ActivityMaxAge: 30 * time.Minute}, "below the duplicate window"},
	} {
		_, err := tc.cfg.ActivityStreamConfig()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error about %q", tc.cfg, err, tc.want)
		}
	}
	a, err := StreamConfig{}.ActivityStreamConfig()
	if err != nil || a.Name != "CRONSTREAM_ACTIVITY" || a.MaxAge != DefaultActivityMaxAge || a.Duplicates != DefaultDuplicateWindow || a.Replicas != 1 {
		t.Fatalf("defaults: %+v %v", a, err)
	}
}

// TestSyncStreamsCreateMissing: what a replica does at start creates what
// is missing and reports, but never updates, an existing stream that
// differs; DryRun reports the same and changes nothing.
func TestSyncStreamsCreateMissing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n := testenv.StartNATS(t)
	js, requests := tracedJetStream(t, n)
	names := contract.MustNames("tenant-c")
	changes, err := SyncStreams(ctx, js, StreamConfig{Names: names}, CreateMissing)
	if err != nil || len(changes) != 2 || changes[0].Field != "stream" || changes[1].Field != "stream" {
		t.Fatalf("first start: %v %v, want both streams created", changes, err)
	}
	requests()
	for _, mode := range []StreamMode{CreateMissing, DryRun} {
		changes, err = SyncStreams(ctx, js, StreamConfig{Names: names, ActivityMaxAge: 61 * time.Minute}, mode)
		want := StreamChange{Stream: "TENANT_C_ACTIVITY", Field: "max_age", Old: "720h0m0s", New: "1h1m0s"}
		if err != nil || len(changes) != 1 || changes[0] != want {
			t.Fatalf("mode %d: %v %v, want %v", mode, changes, err, want)
		}
		for _, subj := range requests() {
			if !strings.Contains(subj, "STREAM.INFO.") {
				t.Errorf("mode %d requested %s; want only STREAM.INFO", mode, subj)
			}
		}
	}
	s, err := js.Stream(ctx, "TENANT_C_ACTIVITY")
	if err != nil || s.CachedInfo().Config.MaxAge != DefaultActivityMaxAge {
		t.Fatalf("activity stream changed: %v", err)
	}
}
