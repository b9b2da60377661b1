package projector

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

const pauseNote = events.FailPauseNotePrefix + "task pt:e:1 archived at 2026-01-01T00:00:00Z: boom"

// requestMsg is a fail-pause request for state e (paused with note by the
// request) conditional on revision rev, as a replica publishes it.
func requestMsg(t testing.TB, e events.Entry, rev uint64, note string) (nats.Header, []byte) {
	t.Helper()
	e.Paused, e.Note = true, note
	raw, err := json.Marshal(e.Normalize())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.NewEvent(events.GatedType(events.TypeEntryPaused, e), "cronstream/r1", e.ID, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ev.Marshal()
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, ev.ID)
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, testNames.EntryRevisionFilter(e.ID))
	return h, b
}

func armedEntry(id string) events.Entry {
	e := validEntry(id)
	e.PauseOnFailure = true
	return e.Normalize()
}

// TestFoldFailPauseRequests: a fail-pause request pauses an armed entry
// only right after its config event, changing nothing but paused and the
// note; anything else on a fail-pause subject, and a NATS server's reply
// on a config subject, is refused: the entry keeps its state and is not
// quarantined.
func TestFoldFailPauseRequests(t *testing.T) {
	t.Parallel()
	at := time.Now()
	e := armedEntry("e")
	f := NewFold(testNames)
	if _, _, err := f.Apply(testNames.ConfigSubject("e"), 1, at, rawEvent(t, events.GatedType(events.TypeEntryRegistered, e), "e", e)); err != nil {
		t.Fatal(err)
	}
	refused := func(seq uint64, subject string, h nats.Header, data []byte, want string) {
		t.Helper()
		before, _ := f.Get("e")
		_, changed, err := f.ApplyMessage(subject, seq, at, h, data)
		var re *RefusedError
		if !errors.As(err, &re) || changed || re.Entry != "e" || !strings.Contains(re.Reason, want) {
			t.Fatalf("seq %d: changed %t, err %v, want a refusal saying %q", seq, changed, err, want)
		}
		if after, ok := f.Get("e"); !ok || !sameState(&before, &after) || len(f.Quarantined()) != 0 {
			t.Fatalf("seq %d changed the entry: %+v → %+v, quarantined %v", seq, before, after, f.Quarantined())
		}
	}
	// Conditional on another revision than its config event's.
	h, b := requestMsg(t, e, 7, pauseNote)
	refused(2, testNames.FailPauseSubject("e"), h, b, "conditional on revision 7")
	// A server's answer on the config subject.
	refused(3, testNames.ConfigSubject("e"), nil, []byte(`{"type":"io.nats.jetstream.api.v1.stream_info_response"}`), "by a NATS server")
	refused(4, testNames.ConfigSubject("e"), nil, nil, "by a NATS server")

	// A request right after a config event pauses the entry.
	if _, _, err := f.Apply(testNames.ConfigSubject("e"), 5, at, rawEvent(t, events.GatedType(events.TypeEntryUpdated, e), "e", e)); err != nil {
		t.Fatal(err)
	}
	h, b = requestMsg(t, e, 5, pauseNote)
	ch, changed, err := f.ApplyMessage(testNames.FailPauseSubject("e"), 6, at, h, b)
	if err != nil || !changed || ch.New == nil || !ch.New.Entry.Paused || !ch.New.FailPause || ch.New.Revision != 6 {
		t.Fatalf("request: %+v %t %v", ch, changed, err)
	}
	if got := ch.New.RevisionSubject(testNames); got != testNames.FailPauseSubject("e") {
		t.Fatalf("revision subject %s", got)
	}
	// Another one after it: the entry is paused by a request, not by a
	// config event.
	h, b = requestMsg(t, e, 6, pauseNote)
	refused(7, testNames.FailPauseSubject("e"), h, b, "not registered, or its last change is not a config event")
	st := f.Stats()
	if st.Refused != 4 || st.Bad != 0 || st.LastSeq != 7 {
		t.Fatalf("stats %+v", st)
	}
	// The revision fence counts config subjects alone: replicas of earlier
	// builds read no request, and a request must fence no one out.
	if f.FenceSeq() != 5 {
		t.Fatalf("fence sequence %d, want 5 (the last config event)", f.FenceSeq())
	}
}

// publishRequest publishes a fail-pause request for e conditional on rev
// (the server checks it) and returns its sequence.
func publishRequest(t testing.TB, js jetstream.JetStream, e events.Entry, rev uint64, note string) uint64 {
	t.Helper()
	h, b := requestMsg(t, e, rev, note)
	ack, err := js.PublishMsg(testCtx(t, 10*time.Second), &nats.Msg{Subject: testNames.FailPauseSubject(e.ID), Header: h, Data: b})
	if err != nil {
		t.Fatalf("publish request: %v", err)
	}
	return ack.Sequence
}

// TestProjectionsAgreeOnFailPauses: a projection that followed the stream
// and one that loaded it afterwards (its last messages per subject, with
// the entries they do not decide read from their history), a replay
// (AsOfSeq) and the config client's List all see the same entries after
// fail-pause requests, refused ones hiding an applied one, and NATS
// server replies stored on config subjects; only the following one logs
// the refusals.
func TestProjectionsAgreeOnFailPauses(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	ctx := testCtx(t, 60*time.Second)
	logs := &logCapture{}
	live := startProjector(t, js, Config{Logger: slog.New(logs)})
	if err := live.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	c := events.NewClient(js, testNames)
	put := func(e events.Entry) uint64 {
		r, err := c.Put(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	// direct: paused by a request.
	rev := put(armedEntry("direct"))
	if _, err := c.FailPause(ctx, "direct", rev, pauseNote); err != nil {
		t.Fatal(err)
	}
	// hidden: paused by a request, then a request that expects it (refused:
	// the entry is already paused) hides it from the last-per-subject view.
	rev = put(armedEntry("hidden"))
	r, err := c.FailPause(ctx, "hidden", rev, pauseNote)
	if err != nil {
		t.Fatal(err)
	}
	publishRequest(t, js, armedEntry("hidden"), r.Revision, pauseNote+" again")
	// garbage: a request of another form, refused, then an operator's
	// change and a request that pauses.
	rev = put(armedEntry("garbage"))
	publishRequest(t, js, armedEntry("garbage"), rev, "forged note")
	changed := armedEntry("garbage")
	changed.Cron = "0 * * * *"
	rev = put(changed)
	if _, err := c.FailPause(ctx, "garbage", rev, pauseNote); err != nil {
		t.Fatal(err)
	}
	// resumed: paused by a request, resumed by the operator.
	rev = put(armedEntry("resumed"))
	if _, err := c.FailPause(ctx, "resumed", rev, pauseNote); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, "resumed"); err != nil {
		t.Fatal(err)
	}
	// replied: its last config message is a server's answer.
	put(validEntry("replied"))
	nc := n.Connect(t)
	if err := nc.PublishRequest("$JS.API.STREAM.INFO."+testNames.ConfigStream(), testNames.ConfigSubject("replied"), nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := js.Stream(ctx, testNames.ConfigStream())
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		last = info.State.LastSeq
		return err == nil && info.State.Msgs == 14
	}, "the stream does not hold the 14 messages")
	if err := live.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}

	want := map[string]bool{"direct": true, "hidden": true, "garbage": true, "resumed": false, "replied": false}
	check := func(what string, got map[string]State) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d entries, want %d: %v", what, len(got), len(want), got)
		}
		for id, paused := range want {
			st, ok := got[id]
			if !ok || st.Entry.Paused != paused || paused && (!st.FailPause || st.Entry.Note != pauseNote) {
				t.Errorf("%s: entry %s: %+v, want paused %t by a request", what, id, st, paused)
			}
		}
	}
	check("following", stateMap(live.Entries()))
	cold := startProjector(t, js, Config{})
	if err := cold.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	check("loaded", stateMap(cold.Entries()))
	if diff := diffMaps(stateMap(live.Entries()), stateMap(cold.Entries())); diff != "" {
		t.Errorf("following and loaded differ: %s", diff)
	}
	asOf, q, err := AsOfSeq(ctx, js, testNames, last)
	if err != nil || len(q) != 0 {
		t.Fatalf("replay: %v %v", q, err)
	}
	check("replay", asOf)
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cur := range list {
		if cur.Entry.Paused != want[cur.ID] || cur.FailPause != want[cur.ID] {
			t.Errorf("list: %s: %+v", cur.ID, cur)
		}
	}
	if got := live.Stats().RefusedLive; got != 3 {
		t.Errorf("following projection refused %d messages, want 3 (two requests, one reply)", got)
	}
	if got := cold.Stats().RefusedLive; got != 0 {
		t.Errorf("loaded projection reports %d refusals as new", got)
	}
	if n := logs.count("config stream message refused"); n != 3 {
		t.Errorf("%d refusal lines, want 3", n)
	}
}

// diffMaps names the entries whose states differ.
func diffMaps(a, b map[string]State) string {
	var out []string
	for id, s := range a {
		o, ok := b[id]
		if !ok || !sameState(&s, &o) {
			out = append(out, id)
		}
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			out = append(out, id)
		}
	}
	return strings.Join(out, ", ")
}

// count counts the records whose message contains msg.
func (c *logCapture) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.records {
		if m, _ := r["msg"].(string); strings.Contains(m, msg) {
			n++
		}
	}
	return n
}
