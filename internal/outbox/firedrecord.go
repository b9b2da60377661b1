package outbox

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// firedRecordV1 tags version 1 of the compact fired record.
const firedRecordV1 = "F1 "

// AppendFiredRecord appends the compact outbox form of a scheduled tick's
// fired event (f without Trigger or Backfill; f.Queue is implied by the
// outbox). ExpandFiredRecord turns it back into the event's JSON.
func AppendFiredRecord(buf []byte, f *contract.Fired) []byte {
	buf = append(buf, firedRecordV1...)
	buf = strconv.AppendInt(buf, f.ScheduledAt.UnixNano(), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, f.EnqueuedAt.UnixNano(), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendUint(buf, f.Revision, 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(len(f.Entry)), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(len(f.TaskID)), 10)
	buf = append(buf, ' ')
	buf = append(buf, f.Entry...)
	buf = append(buf, f.TaskID...)
	return append(buf, f.Replica...)
}

// RecordForm is how an outbox record's data is encoded.
type RecordForm uint8

const (
	// RecordJSON: the event's JSON, published as it is.
	RecordJSON RecordForm = iota
	// RecordFired: a compact fired event (AppendFiredRecord).
	RecordFired
	// RecordBatch: several events, published as one message
	// (BatchRecordTag).
	RecordBatch
	// RecordMulti: the records of several events, each published as its
	// own message (MultiRecordTag).
	RecordMulti
	// RecordNewer: a compact form of a later version than this build
	// knows: leave it for a newer relay.
	RecordNewer
	// RecordUnknown: none of the above (not written by cronstream).
	RecordUnknown
)

func (f RecordForm) String() string {
	switch f {
	case RecordJSON:
		return "JSON"
	case RecordFired:
		return "compact fired"
	case RecordBatch:
		return "batch"
	case RecordMulti:
		return "multi-record"
	case RecordNewer:
		return "newer compact"
	}
	return "unknown"
}

// FormOf tells how an outbox record's data is encoded.
func FormOf(data []byte) RecordForm {
	switch {
	case bytes.HasPrefix(data, []byte(firedRecordV1)):
		return RecordFired
	case bytes.HasPrefix(data, []byte(BatchRecordTag)):
		return RecordBatch
	case bytes.HasPrefix(data, []byte(MultiRecordTag)):
		return RecordMulti
	case len(data) > 0 && data[0] == '{', len(data) > 0 && (data[0] == ' ' || data[0] == '\t' || data[0] == '\n' || data[0] == '\r'):
		return RecordJSON
	case compactTag(data):
		return RecordNewer
	}
	return RecordUnknown
}

// compactTag reports whether data starts like a compact record of any
// version: an upper-case letter, digits, a space.
func compactTag(data []byte) bool {
	if len(data) < 3 || data[0] < 'A' || data[0] > 'Z' {
		return false
	}
	i := 1
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i > 1 && i < len(data) && data[i] == ' '
}

// ErrBadRecord reports a compact record that does not decode.
var ErrBadRecord = errors.New("malformed compact outbox record")

// ExpandFiredRecord appends to buf the JSON of the fired event with id
// eventID that the compact record rec from queue's outbox describes, byte
// for byte what AppendFiredEvent writes for it, and returns the entry (the
// event's subject).
func ExpandFiredRecord(buf []byte, eventID string, rec []byte, queue string) ([]byte, string, error) {
	if !bytes.HasPrefix(rec, []byte(firedRecordV1)) {
		return buf, "", fmt.Errorf("%w: no %q tag", ErrBadRecord, firedRecordV1)
	}
	rest := rec[len(firedRecordV1):]
	var nums [5]int64 // scheduled_at, enqueued_at, (revision), the two lengths
	var rev uint64
	for i := range nums {
		sp := bytes.IndexByte(rest, ' ')
		if sp < 0 {
			return buf, "", fmt.Errorf("%w: %d fields, want 5 numbers", ErrBadRecord, i)
		}
		var v int64
		var err error
		if i == 2 {
			var u uint64
			u, err = strconv.ParseUint(string(rest[:sp]), 10, 64)
			rev, v = u, 0
		} else {
			v, err = strconv.ParseInt(string(rest[:sp]), 10, 64)
		}
		if err != nil || (i > 2 && v < 0) {
			return buf, "", fmt.Errorf("%w: field %d %q", ErrBadRecord, i+1, rest[:sp])
		}
		nums[i], rest = v, rest[sp+1:]
	}
	le, lt := nums[3], nums[4]
	if le > int64(len(rest)) || lt > int64(len(rest))-le {
		return buf, "", fmt.Errorf("%w: lengths %d+%d exceed the %d bytes left", ErrBadRecord, le, lt, len(rest))
	}
	f := contract.Fired{
		Entry:       string(rest[:le]),
		ScheduledAt: time.Unix(0, nums[0]).UTC(),
		EnqueuedAt:  time.Unix(0, nums[1]).UTC(),
		TaskID:      string(rest[le : le+lt]),
		Queue:       queue,
		Revision:    rev,
		Replica:     string(rest[le+lt:]),
	}
	return AppendFiredEvent(buf, eventID, f.EnqueuedAt, contract.ReplicaSource(f.Replica), &f), f.Entry, nil
}
