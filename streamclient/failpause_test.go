package streamclient

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/testenv"
)

// armed registers an entry with pause_on_failure and returns its revision.
func armed(t *testing.T, c *Client, id string) uint64 {
	t.Helper()
	e := validEntry(id)
	e.PauseOnFailure = true
	r, err := c.Put(testCtx(t), e)
	if err != nil {
		t.Fatal(err)
	}
	return r.Revision
}

const testNote = contract.FailPauseNotePrefix + "task p:x:1 archived at 2026-01-01T00:00:00Z: boom"

// TestFailPauseApplied: a fail-pause request pauses an armed entry, every
// reader of its history sees the pause (Get, List, History), and it is
// conditional on the entry's revision over both of its subjects, so an
// operator's write that read the entry before it conflicts instead of
// overwriting it, and a request after the operator's write conflicts too.
func TestFailPauseApplied(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "fpok")
	rev := armed(t, c, "e")
	op := NewClient(js, contract.MustNames("fpok"), WithSource("cronstream/cli/alice"))
	if _, seen, err := op.Get(ctx, "e"); err != nil || seen != rev {
		t.Fatalf("operator's get: %d %v", seen, err)
	}

	r, err := c.FailPause(ctx, "e", rev, testNote)
	if err != nil || r.Type != contract.TypeEntryPaused+contract.GatedSuffix || r.Revision <= rev || !r.Entry.Paused {
		t.Fatalf("fail-pause: %+v %v", r, err)
	}
	got, gotRev, err := NewClient(js, contract.MustNames("fpok")).Get(ctx, "e")
	if err != nil || !got.Paused || got.Note != testNote || gotRev != r.Revision {
		t.Fatalf("get after the pause: %+v rev %d %v", got, gotRev, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || !list[0].Entry.Paused || !list[0].FailPause || list[0].Revision != r.Revision {
		t.Fatalf("list: %+v %v", list, err)
	}
	recs, err := c.History(ctx, "e")
	if err != nil || len(recs) != 2 || !recs[1].FailPause || recs[1].Entry == nil || !recs[1].Entry.Paused || recs[1].Seq != r.Revision {
		t.Fatalf("history: %+v %v", recs, err)
	}

	// The operator read the entry before the pause: its conditional write
	// conflicts, and its unconditional one applies on top of the pause.
	changed := validEntry("e")
	changed.PauseOnFailure, changed.Cron = true, "0 * * * *"
	if _, err := op.Put(ctx, changed, IfRevision(rev)); conflictOf(t, err).Current != r.Revision {
		t.Fatalf("operator's put at the old revision: %v", err)
	}
	if _, err := op.Resume(ctx, "e", IfRevision(rev)); !errors.Is(err, ErrRevisionConflict) {
		t.Fatalf("operator's resume at the old revision: %v", err)
	}
	res, err := op.Resume(ctx, "e")
	if err != nil || res.Type != contract.TypeEntryResumed+contract.GatedSuffix || res.Entry.Paused {
		t.Fatalf("resume: %+v %v", res, err)
	}
	// A request that saw the entry armed before the resume conflicts.
	if _, err := c.FailPause(ctx, "e", rev, testNote); conflictOf(t, err).Current != res.Revision {
		t.Fatalf("fail-pause at an old revision: %v", err)
	}
	if r, err := c.FailPause(ctx, "e", res.Revision, testNote); err != nil || !r.Entry.Paused {
		t.Fatalf("fail-pause after the resume: %+v %v", r, err)
	}
	// A paused entry is not armed.
	_, now, _ := c.Get(ctx, "e")
	if _, err := c.FailPause(ctx, "e", now, testNote); !errors.Is(err, ErrRevisionConflict) && !errors.Is(err, contract.ErrNotArmed) {
		t.Fatalf("fail-pause of a paused entry: %v", err)
	}
	if _, err := c.FailPause(ctx, "e", now, "no prefix"); err == nil {
		t.Fatal("a note without the prefix was accepted")
	}
}

// rawRequest publishes data on entry's fail-pause subject with the given
// headers, as a holder of a replica credential could, and returns its
// sequence.
func rawRequest(t *testing.T, js jetstream.JetStream, names contract.Names, entry string, header nats.Header, data []byte) uint64 {
	t.Helper()
	ack, err := js.PublishMsg(testCtx(t), &nats.Msg{Subject: names.FailPauseSubject(entry), Header: header, Data: data})
	if err != nil {
		t.Fatalf("publish the request: %v", err)
	}
	return ack.Sequence
}

// requestData is a fail-pause request's event for state e.
func requestData(t *testing.T, e contract.Entry, typ string) (string, []byte) {
	t.Helper()
	raw, _ := json.Marshal(e)
	ev, err := contract.NewEventAt(contract.NewEventID(), time.Now(), typ, "cronstream/cli/attacker", e.ID, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ev.Marshal()
	return ev.ID, b
}

// TestFailPauseRefused: requests that do not hold are refused: the entry
// keeps its state in every reader, History leaves them out and
// HistoryAll says why; the entry is never quarantined.
func TestFailPauseRefused(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "fpno")
	names := contract.MustNames("fpno")
	base := func(id string, armedEntry bool) (contract.Entry, uint64) {
		e := validEntry(id)
		e.PauseOnFailure = armedEntry
		r, err := c.Put(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		return r.Entry, r.Revision
	}
	headers := func(id, msgID string, rev uint64) nats.Header {
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, msgID)
		h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
		h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, names.EntryRevisionFilter(id))
		return h
	}
	for _, tc := range []struct {
		name  string
		armed bool
		// forge returns the request's headers and data for the entry's
		// state and revision.
		forge func(id string, e contract.Entry, rev uint64) (nats.Header, []byte)
		want  string
	}{
		{"no headers", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note = true, testNote
			_, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			return nil, b
		}, "no Nats-Expected-Last-Subject-Sequence-Subject"},
		{"conditional on the config subject only", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note = true, testNote
			msgID, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			h := headers(id, msgID, rev)
			h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, names.FailPauseSubject(id))
			h.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			return h, b
		}, "conditional on subject"},
		{"changes the task", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note, e.Task.Type = true, testNote, "evil:task"
			msgID, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			return headers(id, msgID, rev), b
		}, "changes more than"},
		{"resumes", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			msgID, b := requestData(t, e, contract.TypeEntryResumed+contract.GatedSuffix)
			return headers(id, msgID, rev), b
		}, "may only pause"},
		{"note of another form", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note = true, "forged by a replica credential"
			msgID, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			return headers(id, msgID, rev), b
		}, "does not start with"},
		{"entry not armed", false, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note = true, testNote
			msgID, b := requestData(t, e, contract.TypeEntryPaused)
			return headers(id, msgID, rev), b
		}, "not armed"},
		{"another entry state", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note, e.ID = true, testNote, "other"
			msgID, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			return headers(id, msgID, rev), b
		}, "not the entry of the subject"},
		{"event id not its message id", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			e.Paused, e.Note = true, testNote
			_, b := requestData(t, e, contract.TypeEntryPaused+contract.GatedSuffix)
			return headers(id, "another-id", rev), b
		}, "is not its Nats-Msg-Id"},
		{"not JSON", true, func(id string, e contract.Entry, rev uint64) (nats.Header, []byte) {
			return headers(id, "x", rev), []byte("garbage")
		}, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strings.ReplaceAll(tc.name, " ", "-")
			e, rev := base(id, tc.armed)
			h, data := tc.forge(id, e, rev)
			seq := rawRequest(t, js, names, id, h, data)
			got, gotRev, err := c.Get(ctx, id)
			if err != nil || got.Paused || got.Task.Type != e.Task.Type || gotRev != seq {
				t.Fatalf("get: %+v rev %d (request at %d) %v", got, gotRev, seq, err)
			}
			list, err := c.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, cur := range list {
				if cur.ID == id && (cur.Err != nil || cur.Entry.Paused || cur.FailPause) {
					t.Fatalf("list: %+v", cur)
				}
			}
			recs, err := c.History(ctx, id)
			if err != nil || len(recs) != 1 {
				t.Fatalf("history: %+v %v", recs, err)
			}
			all, err := c.HistoryAll(ctx, id)
			if err != nil || len(all) != 2 || all[1].Entry != nil || !errors.Is(all[1].Refused, contract.ErrFailPauseRefused) ||
				!strings.Contains(all[1].Refused.Error(), tc.want) {
				t.Fatalf("history with refusals: %+v %v, want a refusal saying %q", all, err, tc.want)
			}
			// The refused request holds the entry's revision: a request
			// must follow a config event, so fail-pause waits for the
			// entry's next change.
			if _, err := c.FailPause(ctx, id, rev, testNote); !errors.Is(err, ErrRevisionConflict) {
				t.Fatalf("fail-pause after a refused request: %v", err)
			}
		})
	}
}

// TestServerRepliesOnConfigSubjects: NATS delivers the answer to a request
// to whatever reply subject the requester names, and the config stream
// stores what arrives on its subjects. Any client may name a config
// subject: the answers stored there (a JetStream API response, a publish
// acknowledgement) change no entry and quarantine none.
func TestServerRepliesOnConfigSubjects(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n, js, c := newSingle(t, "replies")
	names := contract.MustNames("replies")
	e := validEntry("e")
	r, err := c.Put(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	nc := n.Connect(t)
	if err := nc.PublishRequest("$JS.API.STREAM.INFO."+names.ConfigStream(), names.ConfigSubject("e"), nil); err != nil {
		t.Fatal(err)
	}
	// A publish whose acknowledgement goes to the entry's subjects.
	if err := nc.PublishMsg(&nats.Msg{Subject: names.FireSubject("x"), Reply: names.FailPauseSubject("e"), Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: names.FireSubject("y"), Reply: names.ConfigSubject("e"), Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	// A direct get of a message whose body is a complete config event
	// (anyone who may publish on a stream's subjects can store one), its
	// answer sent to the entry's config subject: a server's relay.
	forged := validEntry("e")
	forged.Task.Type = "evil"
	raw, _ := json.Marshal(forged.Normalize())
	ev, _ := contract.NewEvent(contract.TypeEntryUpdated, "cronstream/cli/attacker", "e", json.RawMessage(raw))
	b, _ := ev.Marshal()
	if _, err := js.Publish(ctx, names.FireSubject("z"), b); err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(msgGetRequest{LastFor: names.FireSubject("z")})
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+names.ActivityStream(), names.ConfigSubject("e"), req); err != nil {
		t.Fatal(err)
	}
	var all []Record
	testenv.Eventually(t, 10*time.Second, func() bool {
		all, err = c.HistoryAll(ctx, "e")
		return err == nil && len(all) == 5
	}, "the replies were not stored")
	for _, rec := range all[1:] {
		if rec.Refused == nil || !strings.Contains(rec.Refused.Error(), "by a NATS server") {
			t.Errorf("reply %d: %+v", rec.Seq, rec)
		}
	}
	got, rev, err := NewClient(js, names).Get(ctx, "e")
	if err != nil || got.Task.Type != e.Task.Type || rev != all[4].Seq {
		t.Fatalf("get: %+v rev %d %v", got, rev, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Err != nil || list[0].Entry.Task.Type != e.Task.Type {
		t.Fatalf("list: %+v %v", list, err)
	}
	if recs, err := c.History(ctx, "e"); err != nil || len(recs) != 1 || recs[0].Seq != r.Revision {
		t.Fatalf("history: %+v %v", recs, err)
	}
	// Writes go on: they expect the entry's last message, reply or not.
	if _, err := c.Pause(ctx, "e", "maintenance"); err != nil {
		t.Fatal(err)
	}
}

// TestFailPauseNeedsTheSubject: a config stream made before fail-pause
// requests does not capture their subject: a request fails at once with
// ErrSubjectNotCaptured, a replica's start reports the difference, and
// `streams apply` (SyncStreams in Apply mode) adds the subject, after
// which requests work.
func TestFailPauseNeedsTheSubject(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	names := contract.MustNames("oldcfg")
	cfg := StreamConfig{Names: names}
	old, err := cfg.ConfigStreamConfig()
	if err != nil {
		t.Fatal(err)
	}
	old.Subjects = []string{names.ConfigFilter()}
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	changes, err := SyncStreams(ctx, js, cfg, CreateMissing)
	if err != nil || len(changes) != 2 || changes[0].Field != "subjects" || changes[1].Field != "stream" {
		t.Fatalf("a replica's look: %v %v", changes, err)
	}
	c := NewClient(js, names, WithRetryBudget(3*time.Second))
	rev := armed(t, c, "e")
	start := time.Now()
	if _, err := c.FailPause(ctx, "e", rev, testNote); !errors.Is(err, ErrSubjectNotCaptured) || time.Since(start) > 2*time.Second {
		t.Fatalf("fail-pause without the subject: %v after %s", err, time.Since(start))
	}
	if changes, err := SyncStreams(ctx, js, cfg, Apply); err != nil || len(changes) != 1 || changes[0].Field != "subjects" {
		t.Fatalf("apply: %v %v", changes, err)
	}
	if changes, err := SyncStreams(ctx, js, cfg, Apply); err != nil || len(changes) != 0 {
		t.Fatalf("apply again: %v %v", changes, err)
	}
	if _, err := c.FailPause(ctx, "e", rev, testNote); err != nil {
		t.Fatal(err)
	}
}

// TestStreamWriteRoutesRefused: a mirror, sources, a subject transform or
// a republish on cronstream's streams makes the server write them other
// than a client's publish: SyncStreams refuses such a stream in every mode
// (a replica does not start on it, `streams apply` does not change it),
// naming the route (a mirror as a mirror, not by its lack of subjects),
// and StreamWriteRoutes names it; another stream republishing onto
// cronstream's subjects is named by RepublishInto.
func TestStreamWriteRoutesRefused(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field  string
		modify func(*jetstream.StreamConfig)
	}{
		{"republish", func(c *jetstream.StreamConfig) {
			c.RePublish = &jetstream.RePublish{Source: ">", Destination: "elsewhere.>"}
		}},
		{"sources", func(c *jetstream.StreamConfig) { c.Sources = []*jetstream.StreamSource{{Name: "OTHER"}} }},
		{"subject_transform", func(c *jetstream.StreamConfig) {
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: ">", Destination: ">"}
		}},
		// A mirror has no subjects: it is written only by the server.
		{"mirror", func(c *jetstream.StreamConfig) { c.Mirror, c.Subjects = &jetstream.StreamSource{Name: "OTHER"}, nil }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			names := contract.MustNames("route-" + strings.ReplaceAll(tc.field, "_", "-"))
			cfg := StreamConfig{Names: names}
			want, err := cfg.ConfigStreamConfig()
			if err != nil {
				t.Fatal(err)
			}
			tc.modify(&want)
			if _, err := js.CreateStream(ctx, want); err != nil {
				t.Fatal(err)
			}
			for _, mode := range []StreamMode{CreateMissing, Apply, DryRun} {
				var sc *StreamConflictError
				if _, err := SyncStreams(ctx, js, cfg, mode); !errors.As(err, &sc) || sc.Field != tc.field {
					t.Fatalf("mode %d: %v, want a conflict on %s", mode, err, tc.field)
				}
			}
			routes, err := StreamWriteRoutes(ctx, js, names)
			if err != nil || len(routes) != 1 || !strings.HasPrefix(routes[0], names.ConfigStream()+": "+tc.field) {
				t.Fatalf("write routes: %v %v", routes, err)
			}
		})
	}
	names := contract.MustNames("target")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REPUB", Subjects: []string{"repub.>"},
		RePublish: &jetstream.RePublish{Source: "repub.e001", Destination: "target.config.e001"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HARMLESS", Subjects: []string{"harmless.>"},
		RePublish: &jetstream.RePublish{Source: ">", Destination: "audit.copy.>"}}); err != nil {
		t.Fatal(err)
	}
	got, err := RepublishInto(ctx, js, names)
	if err != nil || len(got) != 1 || !strings.HasPrefix(got[0], "REPUB: republish") {
		t.Fatalf("republish into target: %v %v", got, err)
	}
}

func TestFiltersOverlap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"p.config.e", "p.>", true},
		{"p.*.e", "p.config.>", true},
		{"q.config.e", "p.>", false},
		{">", "p.x", true},
		{"p.config", "p.config.>", false},
		{"p.config.e.f", "p.*.e", false},
		{"$KV.B.x", "$KV.B.>", true},
	} {
		if got := filtersOverlap(tc.a, tc.b); got != tc.want {
			t.Errorf("filtersOverlap(%q, %q) = %t", tc.a, tc.b, got)
		}
		if got := filtersOverlap(tc.b, tc.a); got != tc.want {
			t.Errorf("filtersOverlap(%q, %q) = %t", tc.b, tc.a, got)
		}
	}
}
