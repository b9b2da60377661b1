package streamclient

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

func TestClientLifecycle(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, _ := newSingle(t, "life")
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	c := NewClient(js, contract.MustNames("life"), WithSource("cronstream/cli/alice"), WithClock(func() time.Time { return at }))

	// First put registers, with every default written out.
	e := validEntry("daily-report")
	r1, err := c.Put(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Type != contract.TypeEntryRegistered || r1.Revision == 0 {
		t.Fatalf("first put: %+v", r1)
	}
	got, rev, err := c.Get(ctx, "daily-report")
	if err != nil || rev != r1.Revision {
		t.Fatalf("get: rev %d err %v, want rev %d", rev, err, r1.Revision)
	}
	if got.Timezone != contract.DefaultTimezone || got.Options.QueueName() != contract.DefaultQueue || got.Options.Retries() != contract.DefaultMaxRetry ||
		got.Options.Timeout != contract.DefaultTimeout || got.Catchup.Policy != contract.CatchupNone || got.Overlap != contract.OverlapAllow {
		t.Fatalf("stored entry lacks defaults: %+v", got)
	}

	// Identical content (defaults spelled out or not) publishes nothing.
	same := e.Normalize()
	r2, err := c.Put(ctx, same)
	if err != nil || r2.Type != "" || r2.Revision != r1.Revision {
		t.Fatalf("no-op put: %+v %v", r2, err)
	}

	// A change updates.
	e.Cron = "0 9 * * *"
	r3, err := c.Put(ctx, e)
	if err != nil || r3.Type != contract.TypeEntryUpdated || r3.Revision <= r1.Revision {
		t.Fatalf("update: %+v %v", r3, err)
	}

	// Pause with a note, pause again (no-op), resume, resume again (no-op).
	r4, err := c.Pause(ctx, "daily-report", "maintenance")
	if err != nil || r4.Type != contract.TypeEntryPaused || !r4.Entry.Paused || r4.Entry.Note != "maintenance" {
		t.Fatalf("pause: %+v %v", r4, err)
	}
	if r, err := c.Pause(ctx, "daily-report", "maintenance"); err != nil || r.Type != "" || r.Revision != r4.Revision {
		t.Fatalf("second pause: %+v %v", r, err)
	}
	got, _, _ = c.Get(ctx, "daily-report")
	if !got.Paused || got.Note != "maintenance" || got.Cron != "0 9 * * *" {
		t.Fatalf("after pause: %+v", got)
	}
	r5, err := c.Resume(ctx, "daily-report")
	if err != nil || r5.Type != contract.TypeEntryResumed || r5.Entry.Paused || r5.Entry.Note != "" {
		t.Fatalf("resume: %+v %v", r5, err)
	}
	if r, err := c.Resume(ctx, "daily-report"); err != nil || r.Type != "" || r.Revision != r5.Revision {
		t.Fatalf("second resume: %+v %v", r, err)
	}

	// Remove keeps the last state, flagged removed; the entry is gone.
	r6, err := c.Remove(ctx, "daily-report")
	if err != nil || r6.Type != contract.TypeEntryRemoved || !r6.Entry.Removed || r6.Entry.Cron != "0 9 * * *" {
		t.Fatalf("remove: %+v %v", r6, err)
	}
	for name, op := range map[string]func() error{
		"get":    func() error { _, _, err := c.Get(ctx, "daily-report"); return err },
		"remove": func() error { _, err := c.Remove(ctx, "daily-report"); return err },
		"pause":  func() error { _, err := c.Pause(ctx, "daily-report", ""); return err },
		"resume": func() error { _, err := c.Resume(ctx, "daily-report"); return err },
	} {
		if err := op(); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s of removed entry: %v, want ErrNotFound", name, err)
		}
	}
	if _, _, err := c.Get(ctx, "never-was"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get of unknown entry: %v, want ErrNotFound", err)
	}

	// Put after removal registers again.
	r7, err := c.Put(ctx, e)
	if err != nil || r7.Type != contract.TypeEntryRegistered {
		t.Fatalf("re-register: %+v %v", r7, err)
	}

	hist, err := c.History(ctx, "daily-report")
	if err != nil {
		t.Fatal(err)
	}
	wantTypes := []string{contract.TypeEntryRegistered, contract.TypeEntryUpdated, contract.TypeEntryPaused, contract.TypeEntryResumed, contract.TypeEntryRemoved, contract.TypeEntryRegistered}
	wantSeqs := []uint64{r1.Revision, r3.Revision, r4.Revision, r5.Revision, r6.Revision, r7.Revision}
	if len(hist) != len(wantTypes) {
		t.Fatalf("history has %d records, want %d", len(hist), len(wantTypes))
	}
	for i, rec := range hist {
		if rec.Err != nil || rec.Event == nil || rec.Entry == nil {
			t.Fatalf("record %d: %+v", i, rec)
		}
		if rec.Event.Type != wantTypes[i] || rec.Seq != wantSeqs[i] {
			t.Errorf("record %d: type %s seq %d, want %s %d", i, rec.Event.Type, rec.Seq, wantTypes[i], wantSeqs[i])
		}
		if rec.Event.Source != "cronstream/cli/alice" || !rec.Event.Time.Equal(at) || rec.Event.Subject != "daily-report" {
			t.Errorf("record %d envelope: source %q time %s subject %q", i, rec.Event.Source, rec.Event.Time, rec.Event.Subject)
		}
		if rec.Time.IsZero() {
			t.Errorf("record %d has no stream time", i)
		}
	}
	if _, err := c.History(ctx, "never-was"); !errors.Is(err, ErrNotFound) {
		t.Errorf("history of unknown entry: %v, want ErrNotFound", err)
	}
}

func TestClientListAndBadEvents(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "list")

	if got, err := c.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("list of empty stream: %v %v", got, err)
	}
	revs := map[string]uint64{}
	for _, id := range []string{"c", "a", "b", "gone"} {
		r, err := c.Put(ctx, validEntry(id))
		if err != nil {
			t.Fatal(err)
		}
		revs[id] = r.Revision
	}
	if _, err := c.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Pause(ctx, "b", "why not")
	if err != nil {
		t.Fatal(err)
	}
	revs["b"] = r.Revision

	// A bad event (not JSON) on an entry's subject, published by someone
	// who bypassed the client.
	ack, err := js.Publish(ctx, contract.MustNames("list").ConfigSubject("bad"), []byte("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	// An event from a newer version: unknown enum value.
	future := validEntry("future").Normalize()
	future.Overlap = "queue"
	ev, _ := contract.NewEvent(contract.TypeEntryRegistered, "cronstream/v9", "future", future)
	raw, _ := ev.Marshal()
	ackFuture, err := js.Publish(ctx, contract.MustNames("list").ConfigSubject("future"), raw)
	if err != nil {
		t.Fatal(err)
	}

	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, cur := range list {
		ids = append(ids, cur.ID)
	}
	if strings.Join(ids, ",") != "a,b,bad,c,future" {
		t.Fatalf("list ids %v, want a,b,bad,c,future", ids)
	}
	for _, cur := range list {
		switch cur.ID {
		case "bad", "future":
			if !errors.Is(cur.Err, contract.ErrMalformedEvent) {
				t.Errorf("%s: err %v, want ErrMalformedEvent", cur.ID, cur.Err)
			}
		default:
			if cur.Err != nil || cur.Revision != revs[cur.ID] || cur.Entry.ID != cur.ID {
				t.Errorf("%s: %+v, want revision %d", cur.ID, cur, revs[cur.ID])
			}
		}
	}
	if list[1].Type != contract.TypeEntryPaused || !list[1].Entry.Paused {
		t.Errorf("b: %+v, want paused", list[1])
	}
	if list[2].Revision != ack.Sequence || list[4].Revision != ackFuture.Sequence {
		t.Errorf("bad entries' revisions %d %d, want %d %d", list[2].Revision, list[4].Revision, ack.Sequence, ackFuture.Sequence)
	}
	if !errors.Is(list[4].Err, contract.ErrInvalidEntry) || !strings.Contains(list[4].Err.Error(), "overlap") {
		t.Errorf("future: %v, want the overlap field named", list[4].Err)
	}

	// Get reports the bad event; pause cannot build on it; a full put
	// repairs the entry.
	if _, _, err := c.Get(ctx, "bad"); !errors.Is(err, contract.ErrMalformedEvent) || errors.Is(err, ErrNotFound) {
		t.Fatalf("get of bad entry: %v, want ErrMalformedEvent", err)
	}
	if _, err := c.Pause(ctx, "bad", ""); !errors.Is(err, contract.ErrMalformedEvent) {
		t.Fatalf("pause of bad entry: %v, want ErrMalformedEvent", err)
	}
	if _, err := c.Put(ctx, validEntry("bad"), IfRevision(0)); conflictOf(t, err).Current != ack.Sequence {
		t.Fatalf("IfRevision(0) on a bad entry: %v, want conflict at %d", err, ack.Sequence)
	}
	fixed, err := c.Put(ctx, validEntry("bad"))
	if err != nil || fixed.Type != contract.TypeEntryUpdated {
		t.Fatalf("repairing put: %+v %v", fixed, err)
	}
	if _, _, err := c.Get(ctx, "bad"); err != nil {
		t.Fatalf("get after repair: %v", err)
	}
	hist, err := c.History(ctx, "bad")
	if err != nil || len(hist) != 2 || hist[0].Event != nil || hist[0].Err == nil || hist[1].Entry == nil {
		t.Fatalf("history of repaired entry: %+v %v", hist, err)
	}
}

func TestClientIfRevision(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, c := newSingle(t, "ifrev")

	e := validEntry("job")
	// Revision 0: only when there is no live entry.
	r1, err := c.Put(ctx, e, IfRevision(0))
	if err != nil || r1.Type != contract.TypeEntryRegistered {
		t.Fatalf("create with IfRevision(0): %+v %v", r1, err)
	}
	e.Cron = "@hourly"
	_, err = c.Put(ctx, e, IfRevision(0))
	if ce := conflictOf(t, err); ce.Entry != "job" || ce.Expected != 0 || ce.Current != r1.Revision {
		t.Fatalf("conflict %+v, want current %d", ce, r1.Revision)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("current revision is %d", r1.Revision)) {
		t.Errorf("message %q does not name the current revision", err)
	}
	// A stale revision is a conflict, even for identical content.
	_, err = c.Put(ctx, validEntry("job"), IfRevision(r1.Revision+100))
	if ce := conflictOf(t, err); ce.Expected != r1.Revision+100 || ce.Current != r1.Revision {
		t.Fatalf("stale revision: %+v", ce)
	}
	// The right revision wins.
	r2, err := c.Put(ctx, e, IfRevision(r1.Revision))
	if err != nil || r2.Type != contract.TypeEntryUpdated {
		t.Fatalf("put at current revision: %+v %v", r2, err)
	}
	// Every write takes it.
	if _, err := c.Pause(ctx, "job", "", IfRevision(r1.Revision)); conflictOf(t, err).Current != r2.Revision {
		t.Fatalf("stale pause: %v", err)
	}
	r3, err := c.Remove(ctx, "job", IfRevision(r2.Revision))
	if err != nil {
		t.Fatal(err)
	}
	// After removal, revision 0 means "no live entry" again.
	r4, err := c.Put(ctx, e, IfRevision(0))
	if err != nil || r4.Type != contract.TypeEntryRegistered || r4.Revision <= r3.Revision {
		t.Fatalf("re-register with IfRevision(0): %+v %v", r4, err)
	}
}

func TestClientRefusesInvalidWrites(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "invalid")
	before := configMsgs(t, js, "INVALID_CONFIG")

	bad := validEntry("job")
	bad.Cron = "every tuesday"
	_, err := c.Put(ctx, bad)
	if !errors.Is(err, contract.ErrInvalidEntry) || !slices.Contains(fieldsOf(err), "cron") {
		t.Fatalf("put of bad cron: %v", err)
	}
	if _, err := c.Put(ctx, validEntry("bad.id")); !slices.Contains(fieldsOf(err), "id") {
		t.Fatalf("put of bad id: %v", err)
	}
	if _, _, err := c.Get(ctx, "bad.id"); !slices.Contains(fieldsOf(err), "id") {
		t.Fatalf("get of bad id: %v", err)
	}
	if _, err := c.Put(ctx, validEntry("job")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, "job", strings.Repeat("n", 2000)); !slices.Contains(fieldsOf(err), "note") {
		t.Fatalf("pause with a huge note: %v", err)
	}
	if _, err := c.Pause(ctx, "job", "n\xff"); !slices.Contains(fieldsOf(err), "note") {
		t.Fatalf("pause with a note that is not UTF-8: %v", err)
	}
	// encoding/json would publish U+FFFD in place of such a source.
	if _, err := NewClient(js, contract.MustNames("invalid"), WithSource("ops/\xff")).Pause(ctx, "job", "why"); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("a source that is not UTF-8: %v", err)
	}
	if got := configMsgs(t, js, "INVALID_CONFIG"); got != before+1 {
		t.Fatalf("config stream holds %d messages, want %d: an invalid write was published", got, before+1)
	}
}

func TestClientWithoutStreams(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n, _, _ := newSingle(t, "present")
	c := NewClient(n.JetStream(t), contract.MustNames("absent"), WithRetryBudget(2*time.Second))
	start := time.Now()
	_, err := c.Put(ctx, validEntry("job"))
	if err == nil || !strings.Contains(err.Error(), "EnsureStreams") || !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("put without streams: %v, want an error naming EnsureStreams", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("put without streams took %s: a missing stream is not transient", d)
	}
}

func TestClientPayloadAboveMaxPayload(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, js, c := newSingle(t, "big")
	e := validEntry("big")
	// Valid (1 MiB is the entry limit), but base64 in JSON makes the event
	// larger than the server's default 1 MB max_payload.
	e.Task.Payload = make([]byte, contract.MaxPayloadBytes)
	_, err := c.Put(ctx, e)
	if err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("put of a 1 MiB payload on a 1 MB max_payload server: %v", err)
	}
	if got := configMsgs(t, js, "BIG_CONFIG"); got != 0 {
		t.Fatalf("config stream holds %d messages after a refused put", got)
	}
}

// configMsgs is how many messages a stream holds.
func configMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}
