package outbox

import (
	"bytes"
	"fmt"
	"strconv"
)

// MultiRecordTag starts a multi-record: the records of several events
// written by one script call (a chunk of fires), each framed as
//
//	<len id> <len data> <id><data>
//
// with decimal lengths in bytes. Each framed record is one event's record
// in a single-event form (JSON or compact) and is published as its own
// message under its own id, on its own subject, in frame order. One stream
// entry per call instead of one per fire is less work for Redis on the
// busiest path (a burst of fires) and for the relay's reads and deletes.
// A relay from before multi-records reads the tag as a newer compact form
// and leaves the record for a newer relay.
const MultiRecordTag = "M1 "

// MultiRecordID is the outbox id of a multi-record whose first record has
// id first. It names the record in logs; it is never a message id (each
// framed record is published under its own). The fire script builds the
// same id from MultiRecordIDPrefix when only some of a call's fires fire.
func MultiRecordID(first string) string {
	return MultiRecordIDPrefix + first
}

// MultiRecordIDPrefix starts every MultiRecordID.
const MultiRecordIDPrefix = "multi:"

// AppendFrame appends one record, framed for a multi-record.
func AppendFrame(buf []byte, id string, data []byte) []byte {
	buf = strconv.AppendInt(buf, int64(len(id)), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(len(data)), 10)
	buf = append(buf, ' ')
	buf = append(buf, id...)
	return append(buf, data...)
}

// Frame is one record of a multi-record.
type Frame struct {
	ID   string
	Data []byte // a slice of the multi-record
}

// SplitMulti returns the records a multi-record holds, in order. A
// multi-record that does not frame exactly is malformed (ErrBadRecord): its
// writer was not cronstream's fire script. What each frame holds is not
// checked here: a reader takes each as a record of its own.
func SplitMulti(rec []byte) ([]Frame, error) {
	rest, ok := bytes.CutPrefix(rec, []byte(MultiRecordTag))
	if !ok {
		return nil, fmt.Errorf("%w: no %q tag", ErrBadRecord, MultiRecordTag)
	}
	var out []Frame
	for len(rest) > 0 {
		var lens [2]int
		for i := range lens {
			sp := bytes.IndexByte(rest, ' ')
			if sp < 1 {
				return nil, fmt.Errorf("%w: frame %d: no length", ErrBadRecord, len(out))
			}
			n, ok := frameLen(rest[:sp])
			if !ok {
				return nil, fmt.Errorf("%w: frame %d: length %q", ErrBadRecord, len(out), rest[:sp])
			}
			lens[i], rest = n, rest[sp+1:]
		}
		if lens[0] > len(rest) || lens[1] > len(rest)-lens[0] {
			return nil, fmt.Errorf("%w: frame %d: lengths %d+%d exceed the %d bytes left", ErrBadRecord, len(out), lens[0], lens[1], len(rest))
		}
		f := Frame{ID: string(rest[:lens[0]]), Data: rest[lens[0] : lens[0]+lens[1] : lens[0]+lens[1]]}
		if f.ID == "" {
			return nil, fmt.Errorf("%w: frame %d: no id", ErrBadRecord, len(out))
		}
		out = append(out, f)
		rest = rest[lens[0]+lens[1]:]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: a multi-record without records", ErrBadRecord)
	}
	return out, nil
}

// frameLen reads a frame's length as AppendFrame writes it: decimal
// digits, no sign, no leading zero, so a multi-record has one spelling.
func frameLen(b []byte) (int, bool) {
	if len(b) == 0 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(string(b))
	return n, err == nil
}

// EventIDs returns the ids of the events an outbox record holds: a
// multi-record's framed ids, or the record's own id (a batch record's is
// the batch's). A malformed multi-record holds none.
func EventIDs(id string, data []byte) []string {
	if FormOf(data) != RecordMulti {
		return []string{id}
	}
	frames, err := SplitMulti(data)
	if err != nil {
		return nil
	}
	ids := make([]string, len(frames))
	for i, f := range frames {
		ids[i] = f.ID
	}
	return ids
}
