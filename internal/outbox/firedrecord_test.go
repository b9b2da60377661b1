package outbox

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// TestFiredRecordExpandsToTheEvent: for fired events of every shape, the
// compact record expands to exactly the JSON the full form would carry
// (times in UTC, the queue the outbox's, the source the replica's).
func TestFiredRecordExpandsToTheEvent(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	text := func(alphabet string, max int) string {
		n := rng.IntN(max + 1)
		var b strings.Builder
		r := []rune(alphabet)
		for range n {
			b.WriteRune(r[rng.IntN(len(r))])
		}
		return b.String()
	}
	const tokens = "abcXYZ019_-"
	const odd = "a Z:0 \"\\<>&\u2028é\n\t\x00"
	for i := range 3000 {
		f := contract.Fired{
			Entry:       text(tokens, 128),
			ScheduledAt: time.Unix(rng.Int64N(4e9)-1e9, rng.Int64N(1e9)),
			EnqueuedAt:  time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)),
			TaskID:      text(odd+tokens, 80),
			Queue:       text(odd+tokens, 20),
			Revision:    rng.Uint64() >> rng.IntN(64),
			Replica:     text(odd+tokens, 40),
		}
		if i%3 == 0 {
			f.ScheduledAt, f.EnqueuedAt = f.ScheduledAt.In(berlin), f.EnqueuedAt.In(berlin)
		}
		id := "fire:" + f.Entry + ":1"
		rec := AppendFiredRecord(nil, &f)
		if FormOf(rec) != RecordFired {
			t.Fatalf("record %q: form %d", rec, FormOf(rec))
		}
		got, entry, err := ExpandFiredRecord([]byte("prefix"), id, rec, f.Queue)
		if err != nil {
			t.Fatalf("expand %q: %v", rec, err)
		}
		utc := f
		utc.ScheduledAt, utc.EnqueuedAt = f.ScheduledAt.UTC(), f.EnqueuedAt.UTC()
		want := AppendFiredEvent([]byte("prefix"), id, utc.EnqueuedAt, contract.ReplicaSource(f.Replica), &utc)
		if !bytes.Equal(got, want) || entry != f.Entry {
			t.Fatalf("record %q expands to\n%s (entry %q)\nwant\n%s", rec, got, entry, want)
		}
	}
}

func TestFormOf(t *testing.T) {
	for data, want := range map[string]RecordForm{
		`{"id":"x"}`:          RecordJSON,
		" \n{}":               RecordJSON,
		"F1 1 2 3 0 0 ":       RecordFired,
		"F2 anything":         RecordNewer,
		`B1 [{"id":"x"}]`:     RecordBatch,
		"B1 ":                 RecordBatch,
		"B2 [{}]":             RecordNewer,
		"M1 1 2 ab{}":         RecordMulti,
		"M2 1 2 ab{}":         RecordNewer,
		"G17 1 2":             RecordNewer,
		"F1x":                 RecordUnknown,
		"F 1":                 RecordUnknown,
		"f1 1":                RecordUnknown,
		"":                    RecordUnknown,
		"\xff":                RecordUnknown,
		"not an event at all": RecordUnknown,
	} {
		if got := FormOf([]byte(data)); got != want {
			t.Errorf("FormOf(%q) = %d, want %d", data, got, want)
		}
	}
	if b, ok := BatchEvents([]byte(`B1 [{"id":"x"}]`)); !ok || string(b) != `[{"id":"x"}]` {
		t.Errorf("BatchEvents = %q, %v", b, ok)
	}
}

// TestExpandFiredRecordRefuses: a record that does not decode is an error,
// never a panic or a made-up event.
func TestExpandFiredRecordRefuses(t *testing.T) {
	for _, rec := range []string{
		"",
		"F1 ",
		"F2 1 2 3 1 1 ab",
		"F1 1 2 3 1 1",
		"F1 1 2 3 4 5 short",
		"F1 x 2 3 1 1 ab",
		"F1 1 2 -3 1 1 ab",
		"F1 1 2 3 -1 1 ab",
		"F1 1 2 3 1 -1 ab",
		"F1 1 2 3 9223372036854775807 9223372036854775807 ab",
		"F1 1 2 3 1 9223372036854775807 ab",
		"F1 99999999999999999999 2 3 1 1 ab",
		"F1 1 2 3 1 1 ab extra fields are the replica",
	} {
		_, _, err := ExpandFiredRecord(nil, "fire:a:1", []byte(rec), "q")
		if strings.HasSuffix(rec, "are the replica") {
			if err != nil {
				t.Errorf("%q: %v", rec, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadRecord) {
			t.Errorf("%q: err %v, want ErrBadRecord", rec, err)
		}
	}
}

func FuzzExpandFiredRecord(f *testing.F) {
	f.Add([]byte("F1 1700000000000000000 1700000000100000000 42 2 5 e1task1host-1"))
	f.Add([]byte("F1 1 2 3 1 1 ab"))
	f.Fuzz(func(t *testing.T, rec []byte) {
		out, entry, err := ExpandFiredRecord(nil, "fire:x:1", rec, "q")
		if err != nil {
			return
		}
		ev, derr := contract.DecodeEvent(out)
		if derr != nil || ev.Type != contract.TypeEntryFired || (contract.ValidateID(entry) == nil && ev.Subject != entry) {
			t.Fatalf("record %q expanded to %s: %v", rec, out, derr)
		}
	})
}
