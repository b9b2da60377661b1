package contract

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIDFormats pins the bytes of every id: exactly-once across replicas and
// versions depends on them, so a change here is a change of the contract.
func TestIDFormats(t *testing.T) {
	tick := time.Date(2026, 11, 30, 9, 0, 0, 0, time.FixedZone("x", 3600))
	expiry := time.Unix(1741770000, 0)
	for _, c := range []struct{ got, want string }{
		{TaskID("cronstream", "daily-report", tick), "cronstream:daily-report:2026-11-30T08:00:00Z"},
		{TaskIDOfTickText("p", "e", FormatTaskTick(tick)), "p:e:2026-11-30T08:00:00Z"},
		{TriggerTaskID("cronstream", "e", "req-1"), "cronstream:e:trigger:req-1"},
		{TaskIDPrefix("cronstream", "e"), "cronstream:e:"},
		{FiredEventID("daily-report", tick), "fire:daily-report:1796025600"},
		{SkippedEventID("e", tick), "skip:e:1796025600"},
		{SkippedRangeEventID("e", tick.Add(-time.Hour), tick), "skip:e:1796022000-1796025600"},
		{TriggerFiredEventID("e", "req-1"), "trigger:e:req-1"},
		{TriggerSkippedEventID("e", "req-1"), "skip:e:trigger:req-1"},
		{RecoveredEventID("default", "abc", 2, expiry), "recover:default:abc:2:1741770000"},
		{RecoveredEventID("a.b", "cronstream:e:2026-11-30T08:00:00Z", 0, expiry), "recover:a~2eb:cronstream:e:2026-11-30T08:00:00Z:0:1741770000"},
		{RecoveredEventID("q", "has space", 0, expiry), "recover:e8acc3355d615f6b35c39d9f430c00a65eafe33d9bd18d7cfb07a6ba6b6996c7"},
		{ReclaimedEventID("default", "set-1"), "reclaim:default:set-1"},
		{LostEventID("e", tick.Add(-time.Hour), tick), "lost:e:1796022000-1796025600"},
		{LostEventID("e", tick, tick), "lost:e:1796025600-1796025600"},
		{LostEventID("e", time.Time{}, tick), "lost:e:unknown-1796025600"},
		{DefaultPrefix, "cronstream"},
		{MustNames("").FireFilter(), "cronstream.fire.>"},
		{MustNames("t").RecoveryFilter(), "t.recovery.>"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseIDsRejects(t *testing.T) {
	for _, id := range []string{
		"", "cronstream", "cronstream:e", "cronstream:e:", "cronstream:e:2026-11-30T08:00:00+01:00",
		"cronstream:e:2026-11-30T08:00:00.5Z", "cronstream:e:trigger:", "cronstream:e:trigger:a:b",
		"cronstream:a.b:2026-11-30T08:00:00Z", "p.q:e:2026-11-30T08:00:00Z", ":e:2026-11-30T08:00:00Z",
	} {
		if f, ok := ParseTaskID(id); ok {
			t.Errorf("ParseTaskID(%q) = %+v, want not ok", id, f)
		}
	}
	for _, id := range []string{
		"", "fire", "fire:e", "fire:e:", "fire:e:notanumber", "fire:e:+5", "fire:e:05", "fire:e:1-2",
		"fire:e:trigger:r", "skip:e:1-", "skip:e:-", "skip:e:1-x", "skip:e:trigger:a:b", "skip:a.b:1",
		"trigger:e", "trigger:e:", "trigger:e:a:b", "retry:q:abc", "recover:q", "recover:q:t:1",
		"recover:q:t:x:1", "recover:~zz:t:1:1", "recover:" + strings.Repeat("A", 64), "reclaim:q",
		"reclaim:~zz:s", "lost:e:5", "lost:e:unknown", "lost:e:unknown-", "lost:e:unknown-x", "lost:e:1-",
		"lost:a.b:1-2", "lost:e:trigger:r", "lost:e:",
	} {
		if f, ok := ParseEventID(id); ok {
			t.Errorf("ParseEventID(%q) = %+v, want not ok", id, f)
		}
	}
}

// TestIDsRoundTrip builds ids from random fields, valid and not (dots,
// colons, unicode, control bytes, the longest ids), and parses them: what
// is built from valid fields parses back to the same fields; what is built
// from fields the product refuses never parses as something else.
func TestIDsRoundTrip(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	for range 20000 {
		prefix, entry, req := randName(rng, 64), randName(rng, maxIDLen), randName(rng, maxIDLen)
		queue, taskID, setID := randAny(rng), randAny(rng), randAny(rng)
		tick := time.Unix(rng.Int64N(1<<40)-1<<39, 0).UTC()
		first := tick.Add(-time.Duration(rng.IntN(1<<20)) * time.Second)
		retried := rng.IntN(1000)
		entryOK, reqOK := ValidateID(entry) == nil, ValidateID(req) == nil
		ticksOK := tick.Year() >= 0 && tick.Year() <= 9999 // RFC 3339's range

		checkTask := func(id string, want TaskIDFields, valid bool) {
			t.Helper()
			got, ok := ParseTaskID(id)
			if ok && got != want || !ok && valid {
				t.Fatalf("ParseTaskID(%q) = %+v %v, built from %+v (valid %v)", id, got, ok, want, valid)
			}
		}
		if ticksOK {
			checkTask(TaskID(prefix, entry, tick), TaskIDFields{Prefix: prefix, Entry: entry, Tick: tick}, isPrefix(prefix) && entryOK)
		}
		checkTask(TriggerTaskID(prefix, entry, req), TaskIDFields{Prefix: prefix, Entry: entry, RequestID: req}, isPrefix(prefix) && entryOK && reqOK)

		checkEvent := func(id string, want EventIDFields, mustParse bool) {
			t.Helper()
			got, ok := ParseEventID(id)
			if ok && got != want || !ok && mustParse {
				t.Fatalf("ParseEventID(%q) = %+v %v, built from %+v", id, got, ok, want)
			}
		}
		checkEvent(FiredEventID(entry, tick), EventIDFields{Kind: EventIDFired, Entry: entry, First: tick, Last: tick}, entryOK)
		checkEvent(SkippedEventID(entry, tick), EventIDFields{Kind: EventIDSkipped, Entry: entry, First: tick, Last: tick}, entryOK)
		if !first.Equal(tick) {
			checkEvent(SkippedRangeEventID(entry, first, tick), EventIDFields{Kind: EventIDSkipped, Entry: entry, First: first, Last: tick}, entryOK)
		}
		checkEvent(LostEventID(entry, first, tick), EventIDFields{Kind: EventIDLost, Entry: entry, First: first, Last: tick}, entryOK)
		checkEvent(LostEventID(entry, time.Time{}, tick), EventIDFields{Kind: EventIDLost, Entry: entry, Last: tick}, entryOK)
		checkEvent(TriggerFiredEventID(entry, req), EventIDFields{Kind: EventIDTriggered, Entry: entry, RequestID: req}, entryOK && reqOK)
		checkEvent(TriggerSkippedEventID(entry, req), EventIDFields{Kind: EventIDSkipped, Entry: entry, RequestID: req}, entryOK && reqOK)

		id := RecoveredEventID(queue, taskID, retried, tick)
		got, ok := ParseEventID(id)
		switch {
		case !ok:
			t.Fatalf("ParseEventID(%q) not ok", id)
		case got.Hashed:
			key := EncodeQueueToken(queue) + ":" + taskID + ":" + strconv.Itoa(retried) + ":" + strconv.FormatInt(tick.Unix(), 10)
			if got != (EventIDFields{Kind: EventIDRecovered, Hashed: true}) || isPlainKey("recover:", key) {
				t.Fatalf("ParseEventID(%q) = %+v", id, got)
			}
		case got != EventIDFields{Kind: EventIDRecovered, Queue: queue, TaskID: taskID, Retried: retried, LeaseExpiry: tick}:
			t.Fatalf("ParseEventID(%q) = %+v, built from %q %q %d %s", id, got, queue, taskID, retried, tick)
		}
		id = ReclaimedEventID(queue, setID)
		got, ok = ParseEventID(id)
		switch {
		case !ok:
			t.Fatalf("ParseEventID(%q) not ok", id)
		case got.Hashed:
			if got != (EventIDFields{Kind: EventIDReclaimed, Hashed: true}) || isPlainKey("reclaim:", EncodeQueueToken(queue)+":"+setID) {
				t.Fatalf("ParseEventID(%q) = %+v", id, got)
			}
		case got != EventIDFields{Kind: EventIDReclaimed, Queue: queue, SetID: setID}:
			t.Fatalf("ParseEventID(%q) = %+v, built from %q %q", id, got, queue, setID)
		}
		if len(id) > 256 {
			t.Fatalf("event id of %d bytes: %q", len(id), id)
		}

		names, err := NewNames(prefix)
		if (err == nil) != isPrefix(prefix) {
			t.Fatalf("NewNames(%q): %v", prefix, err)
		}
		if err != nil {
			continue
		}
		for _, c := range []struct {
			subject string
			parse   func(string) (string, bool)
			want    string
		}{
			{names.ConfigSubject(entry), names.EntryFromConfigSubject, entry},
			{names.FireSubject(entry), names.EntryFromFireSubject, entry},
			{names.RecoverySubject(queue), names.QueueFromRecoverySubject, queue},
		} {
			got, ok := c.parse(c.subject)
			if ok && got != c.want || !ok && (entryOK || c.want == queue) {
				t.Fatalf("subject %q parsed as %q %v, built from %q", c.subject, got, ok, c.want)
			}
			if !matchesFilter(c.subject, names) {
				t.Fatalf("subject %q outside the activity and config filters", c.subject)
			}
		}
	}
}

// matchesFilter reports whether subject lies under one of names' filters.
func matchesFilter(subject string, names Names) bool {
	for _, f := range append(names.ActivitySubjects(), names.ConfigFilter()) {
		if strings.HasPrefix(subject, strings.TrimSuffix(f, ">")) {
			return true
		}
	}
	return false
}

// randName is mostly a valid id of up to max bytes (often exactly max or
// one more), sometimes with a dot, colon, space or unicode in it.
func randName(rng *rand.Rand, max int) string {
	const valid = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
	var n int
	switch rng.IntN(4) {
	case 0:
		n = max
	case 1:
		n = max + 1
	default:
		n = 1 + rng.IntN(12)
	}
	var b strings.Builder
	for range n {
		b.WriteByte(valid[rng.IntN(len(valid))])
	}
	s := b.String()
	if rng.IntN(3) == 0 {
		bad := []string{".", ":", " ", "é", "日本", "\x00", "*", ">", "trigger:", "~"}[rng.IntN(10)]
		i := rng.IntN(len(s) + 1)
		s = s[:i] + bad + s[i:]
	}
	return s
}

// randAny is any string: asynq queues, task ids and set ids are.
func randAny(rng *rand.Rand) string {
	switch rng.IntN(4) {
	case 0:
		return randName(rng, 8)
	case 1:
		return "cronstream:" + randName(rng, 10) + ":2026-11-30T08:00:00Z"
	case 2:
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	return strings.Repeat("q", rng.IntN(210))
}

func TestParseTickIDsDoNotAllocate(t *testing.T) {
	// The ids observers parse for every record relayed.
	ids := []string{"fire:daily-report:1796025600", "skip:e:1796022000-1796025600", "skip:e:trigger:req-1", "fire:e:-5"}
	if n := testing.AllocsPerRun(100, func() {
		for _, id := range ids {
			if _, ok := ParseEventID(id); !ok {
				t.Fatal(id)
			}
		}
	}); n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}
