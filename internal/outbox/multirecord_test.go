package outbox

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// TestMultiRecordRoundTrip: frames of every single-event form, ids and data
// holding spaces, digits and the tag itself, come back as written, in order.
func TestMultiRecordRoundTrip(t *testing.T) {
	fired := AppendFiredRecord(nil, &contract.Fired{Entry: "e1", ScheduledAt: time.Unix(60, 0), EnqueuedAt: time.Unix(61, 0), TaskID: "t 1", Revision: 3, Replica: "r"})
	want := []Frame{
		{ID: "fire:e1:60000", Data: fired},
		{ID: "12 34 ", Data: []byte(`{"id":"12 34 ","type":"x"}`)},
		{ID: "M1 ", Data: []byte("F1 9 9 9 0 0 M1 1 1 ab")},
		{ID: "x", Data: []byte{}},
	}
	rec := []byte(MultiRecordTag)
	for _, f := range want {
		rec = AppendFrame(rec, f.ID, f.Data)
	}
	if FormOf(rec) != RecordMulti {
		t.Fatalf("form %d", FormOf(rec))
	}
	got, err := SplitMulti(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, want, func(a, b Frame) bool { return a.ID == b.ID && string(a.Data) == string(b.Data) }) {
		t.Fatalf("frames %q, want %q", got, want)
	}
	// A frame's data cannot grow into the next frame's.
	got[0].Data = append(got[0].Data, 'X')
	if again, _ := SplitMulti(rec); string(again[1].Data) != string(want[1].Data) {
		t.Fatalf("appending to a frame changed the next: %q", again[1].Data)
	}
	if ids := EventIDs("multi:x", rec); !slices.Equal(ids, []string{"fire:e1:60000", "12 34 ", "M1 ", "x"}) {
		t.Errorf("EventIDs = %q", ids)
	}
	if ids := EventIDs("fire:e:1", fired); !slices.Equal(ids, []string{"fire:e:1"}) {
		t.Errorf("EventIDs of a single record = %q", ids)
	}
}

// TestSplitMultiRefuses: a multi-record that does not frame exactly is an
// error, never a panic, a partial list or a made-up record.
func TestSplitMultiRefuses(t *testing.T) {
	for _, rec := range []string{
		"M1 ",
		"M2 1 1 ab",
		"M1 1 1 a",
		"M1 1 1 abc",
		"M1 1 1ab",
		"M1 1  ab",
		"M1 x 1 ab",
		"M1 -1 1 ab",
		"M1 +1 1 ab",
		"M1 01 1 ab",
		"M1 1 00 a",
		"M1 1 -1 ab",
		"M1 0 1 a",
		"M1 9223372036854775807 9223372036854775807 ab",
		"M1 1 9223372036854775807 ab",
		"M1 99999999999999999999 1 ab",
		"M1 1 1 ab1 1 cd 1",
	} {
		frames, err := SplitMulti([]byte(rec))
		if !errors.Is(err, ErrBadRecord) || frames != nil {
			t.Errorf("SplitMulti(%q) = %q, %v; want ErrBadRecord", rec, frames, err)
		}
		if ids := EventIDs("multi:x", []byte(rec)); len(ids) != 0 && rec[:3] == MultiRecordTag {
			t.Errorf("EventIDs(%q) = %q, want none", rec, ids)
		}
	}
}

// FuzzSplitMulti: any input either splits into frames that frame back into
// exactly the input, or is refused.
func FuzzSplitMulti(f *testing.F) {
	f.Add([]byte("M1 1 1 ab"))
	f.Add([]byte("M1 3 2 abc{}1 0 x"))
	f.Fuzz(func(t *testing.T, rec []byte) {
		frames, err := SplitMulti(rec)
		if err != nil {
			return
		}
		back := []byte(MultiRecordTag)
		for _, fr := range frames {
			back = AppendFrame(back, fr.ID, fr.Data)
		}
		if string(back) != string(rec) {
			t.Fatalf("%q split and framed again is %q", rec, back)
		}
	})
}
