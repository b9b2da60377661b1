package taskstate

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The codecs below write and read asynq v0.26.0's protobuf messages
// (asynq.proto, docs/asynq-compat.md "Task message encoding") with protowire directly, so
// cronstream needs no generated code and controls determinism: fields are
// written in ascending field-number order, proto3 defaults are omitted, and map
// entries are sorted by key (asynq's own encoder writes maps in random order,
// which is why nothing may ever compare msg bytes across writers).
//
// Decoding follows the Go protobuf runtime that asynq uses: unknown fields and
// known fields with an unexpected wire type are skipped, the last occurrence of
// a scalar wins, embedded messages merge, and proto3 string fields must be
// valid UTF-8. Every failure is an error wrapping ErrMalformed, never a panic.

// ErrMalformed reports bytes that are not a valid encoding of the expected
// message, or a message whose string fields are not valid UTF-8.
var ErrMalformed = errors.New("malformed protobuf message")

// TaskMessage is asynq's TaskMessage, stored in the task hash's "msg" field.
// Times are Unix seconds, 0 meaning unset, exactly as on the wire.
type TaskMessage struct {
	Type         string            // 1
	Payload      []byte            // 2
	ID           string            // 3
	Queue        string            // 4
	Retry        int32             // 5: maximum retries
	Retried      int32             // 6: retries done so far
	ErrorMsg     string            // 7
	Timeout      int64             // 8: per-attempt timeout, seconds
	Deadline     int64             // 9: absolute deadline, Unix seconds
	UniqueKey    string            // 10
	LastFailedAt int64             // 11: Unix seconds
	Retention    int64             // 12: seconds
	CompletedAt  int64             // 13: Unix seconds
	GroupKey     string            // 14
	Headers      map[string]string // 15 (new in asynq v0.26.0)
}

// SchedulerEntry is asynq's SchedulerEntry, one element of the list under
// SchedulerEntriesKey. Next and Prev are always written; the Go zero time is
// written as seconds -62135596800, as asynq does (docs/asynq-compat.md "Timestamps").
type SchedulerEntry struct {
	ID             string    // 1
	Spec           string    // 2
	TaskType       string    // 3
	TaskPayload    []byte    // 4
	EnqueueOptions []string  // 5: Option.String() forms, each "Name(arg)"
	Next           time.Time // 6
	Prev           time.Time // 7
}

// SchedulerEnqueueEvent is asynq's SchedulerEnqueueEvent, a member of the
// ZSET under SchedulerHistoryKey.
type SchedulerEnqueueEvent struct {
	TaskID      string    // 1
	EnqueueTime time.Time // 2
}

// EncodeTaskMessage encodes m as asynq's TaskMessage. It fails when a string
// field or header is not valid UTF-8, because asynq could not decode it.
func EncodeTaskMessage(m *TaskMessage) ([]byte, error) {
	if m == nil {
		return nil, fmt.Errorf("encode task message: nil message")
	}
	// One allocation, of the exact size.
	return AppendTaskMessage(make([]byte, 0, taskMessageSize(m)), m)
}

// AppendTaskMessage appends m, encoded as EncodeTaskMessage encodes it, to
// dst: the fires of a batch encode their messages into one buffer. On an
// error dst comes back as it was.
func AppendTaskMessage(dst []byte, m *TaskMessage) ([]byte, error) {
	if m == nil {
		return dst, fmt.Errorf("encode task message: nil message")
	}
	e := encoder{b: slices.Grow(dst, taskMessageSize(m))}
	e.str(1, "type", m.Type)
	e.bytes(2, m.Payload)
	e.str(3, "id", m.ID)
	e.str(4, "queue", m.Queue)
	e.varint(5, uint64(int64(m.Retry)))
	e.varint(6, uint64(int64(m.Retried)))
	e.str(7, "error_msg", m.ErrorMsg)
	e.varint(8, uint64(m.Timeout))
	e.varint(9, uint64(m.Deadline))
	e.str(10, "unique_key", m.UniqueKey)
	e.varint(11, uint64(m.LastFailedAt))
	e.varint(12, uint64(m.Retention))
	e.varint(13, uint64(m.CompletedAt))
	e.str(14, "group_key", m.GroupKey)
	var room [8]string // the keys of a few headers sort without an allocation
	keys := room[:0]
	for k := range m.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m.Headers[k]
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			e.fail(fmt.Errorf("header %q: %w", k, errInvalidUTF8))
			continue
		}
		// Map entries always carry both key and value, even empty ones, as
		// the protobuf runtime writes them; the entry is written in place,
		// its length first.
		e.b = protowire.AppendTag(e.b, 15, protowire.BytesType)
		e.b = protowire.AppendVarint(e.b, uint64(1+protowire.SizeBytes(len(k))+1+protowire.SizeBytes(len(v))))
		e.b = protowire.AppendTag(e.b, 1, protowire.BytesType)
		e.b = protowire.AppendString(e.b, k)
		e.b = protowire.AppendTag(e.b, 2, protowire.BytesType)
		e.b = protowire.AppendString(e.b, v)
	}
	if e.err != nil {
		return dst, fmt.Errorf("encode task message: %w", e.err)
	}
	return e.b, nil
}

// DecodeTaskMessage decodes asynq's TaskMessage.
func DecodeTaskMessage(b []byte) (*TaskMessage, error) {
	m := &TaskMessage{}
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		var err error
		switch {
		case typ == protowire.BytesType:
			switch num {
			case 1:
				m.Type, err = utf8Field("type", v)
			case 2:
				m.Payload = append([]byte{}, v...)
			case 3:
				m.ID, err = utf8Field("id", v)
			case 4:
				m.Queue, err = utf8Field("queue", v)
			case 7:
				m.ErrorMsg, err = utf8Field("error_msg", v)
			case 10:
				m.UniqueKey, err = utf8Field("unique_key", v)
			case 14:
				m.GroupKey, err = utf8Field("group_key", v)
			case 15:
				err = decodeHeader(m, v)
			}
		case typ == protowire.VarintType:
			switch num {
			case 5:
				m.Retry = int32(x)
			case 6:
				m.Retried = int32(x)
			case 8:
				m.Timeout = int64(x)
			case 9:
				m.Deadline = int64(x)
			case 11:
				m.LastFailedAt = int64(x)
			case 12:
				m.Retention = int64(x)
			case 13:
				m.CompletedAt = int64(x)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("decode task message: %w", err)
	}
	return m, nil
}

func decodeHeader(m *TaskMessage, b []byte) error {
	var k, v string
	err := walk(b, func(num protowire.Number, typ protowire.Type, raw []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case 1:
			k, err = utf8Field("header key", raw)
		case 2:
			v, err = utf8Field("header value", raw)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	if m.Headers == nil {
		m.Headers = make(map[string]string)
	}
	m.Headers[k] = v
	return nil
}

// EncodeSchedulerEntry encodes e as asynq's SchedulerEntry.
func EncodeSchedulerEntry(se *SchedulerEntry) ([]byte, error) {
	if se == nil {
		return nil, fmt.Errorf("encode scheduler entry: nil entry")
	}
	return appendSchedulerEntry(make([]byte, 0, schedulerEntrySize(se)), se)
}

// appendSchedulerEntry appends se encoded as asynq's SchedulerEntry to b;
// on error b is returned as it was.
func appendSchedulerEntry(b []byte, se *SchedulerEntry) ([]byte, error) {
	e := encoder{b: b}
	e.str(1, "id", se.ID)
	e.str(2, "spec", se.Spec)
	e.str(3, "task_type", se.TaskType)
	e.bytes(4, se.TaskPayload)
	for _, opt := range se.EnqueueOptions {
		// Repeated strings are written even when empty: presence is the element.
		if !utf8.ValidString(opt) {
			e.fail(fmt.Errorf("enqueue option %q: %w", opt, errInvalidUTF8))
			continue
		}
		e.b = protowire.AppendTag(e.b, 5, protowire.BytesType)
		e.b = protowire.AppendString(e.b, opt)
	}
	e.timestamp(6, se.Next)
	e.timestamp(7, se.Prev)
	if e.err != nil {
		return b, fmt.Errorf("encode scheduler entry: %w", e.err)
	}
	return e.b, nil
}

// schedulerEntrySize is about the size of se encoded (a little more):
// what to reserve for it.
func schedulerEntrySize(se *SchedulerEntry) int {
	// Each field's tag and length take at most 6 bytes; each timestamp
	// at most 2 + 2 + 10 + 1 + 5.
	n := 4*6 + len(se.ID) + len(se.Spec) + len(se.TaskType) + len(se.TaskPayload) + 2*20
	for _, opt := range se.EnqueueOptions {
		n += 6 + len(opt)
	}
	return n
}

// DecodeSchedulerEntry decodes asynq's SchedulerEntry. An absent timestamp
// decodes as the Unix epoch, as asynq's readers see it.
func DecodeSchedulerEntry(b []byte) (*SchedulerEntry, error) {
	se := &SchedulerEntry{}
	var next, prev timestamp
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case 1:
			se.ID, err = utf8Field("id", v)
		case 2:
			se.Spec, err = utf8Field("spec", v)
		case 3:
			se.TaskType, err = utf8Field("task_type", v)
		case 4:
			se.TaskPayload = append([]byte{}, v...)
		case 5:
			var s string
			if s, err = utf8Field("enqueue_options", v); err == nil {
				se.EnqueueOptions = append(se.EnqueueOptions, s)
			}
		case 6:
			err = next.merge("next_enqueue_time", v)
		case 7:
			err = prev.merge("prev_enqueue_time", v)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("decode scheduler entry: %w", err)
	}
	se.Next, se.Prev = next.time(), prev.time()
	return se, nil
}

// EncodeSchedulerEnqueueEvent encodes ev as asynq's SchedulerEnqueueEvent.
func EncodeSchedulerEnqueueEvent(ev *SchedulerEnqueueEvent) ([]byte, error) {
	if ev == nil {
		return nil, fmt.Errorf("encode scheduler enqueue event: nil event")
	}
	var e encoder
	e.str(1, "task_id", ev.TaskID)
	e.timestamp(2, ev.EnqueueTime)
	if e.err != nil {
		return nil, fmt.Errorf("encode scheduler enqueue event: %w", e.err)
	}
	return e.b, nil
}

// DecodeSchedulerEnqueueEvent decodes asynq's SchedulerEnqueueEvent.
func DecodeSchedulerEnqueueEvent(b []byte) (*SchedulerEnqueueEvent, error) {
	ev := &SchedulerEnqueueEvent{}
	var at timestamp
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case 1:
			ev.TaskID, err = utf8Field("task_id", v)
		case 2:
			err = at.merge("enqueue_time", v)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("decode scheduler enqueue event: %w", err)
	}
	ev.EnqueueTime = at.time()
	return ev, nil
}

var errInvalidUTF8 = fmt.Errorf("%w: string field contains invalid UTF-8", ErrMalformed)

// taskMessageSize is the length of EncodeTaskMessage's output for m.
func taskMessageSize(m *TaskMessage) int {
	str := func(s string) int { return field(len(s)) }
	num := func(v uint64) int {
		if v == 0 {
			return 0
		}
		return 1 + protowire.SizeVarint(v)
	}
	n := str(m.Type) + field(len(m.Payload)) + str(m.ID) + str(m.Queue) +
		num(uint64(int64(m.Retry))) + num(uint64(int64(m.Retried))) + str(m.ErrorMsg) +
		num(uint64(m.Timeout)) + num(uint64(m.Deadline)) + str(m.UniqueKey) +
		num(uint64(m.LastFailedAt)) + num(uint64(m.Retention)) + num(uint64(m.CompletedAt)) + str(m.GroupKey)
	for k, v := range m.Headers {
		n += 1 + protowire.SizeBytes(1+protowire.SizeBytes(len(k))+1+protowire.SizeBytes(len(v)))
	}
	return n
}

// field is the encoded size of a length-delimited field of n bytes, 0 for
// an empty one (left out).
func field(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

// encoder appends proto3 fields, omitting defaults, and remembers the first
// error so call sites stay linear.
type encoder struct {
	b   []byte
	err error
}

func (e *encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *encoder) str(num protowire.Number, name, s string) {
	if s == "" {
		return
	}
	if !utf8.ValidString(s) {
		e.fail(fmt.Errorf("field %s: %w", name, errInvalidUTF8))
		return
	}
	e.b = protowire.AppendTag(e.b, num, protowire.BytesType)
	e.b = protowire.AppendString(e.b, s)
}

func (e *encoder) bytes(num protowire.Number, v []byte) {
	if len(v) == 0 {
		return
	}
	e.b = protowire.AppendTag(e.b, num, protowire.BytesType)
	e.b = protowire.AppendBytes(e.b, v)
}

func (e *encoder) varint(num protowire.Number, v uint64) {
	if v == 0 {
		return
	}
	e.b = protowire.AppendTag(e.b, num, protowire.VarintType)
	e.b = protowire.AppendVarint(e.b, v)
}

// timestamp writes t as an embedded google.protobuf.Timestamp the way
// timestamppb.New does: seconds = t.Unix(), nanos = t.Nanosecond(). The Go
// zero time therefore becomes seconds -62135596800. Like any embedded
// message it is present even when both fields are zero.
func (e *encoder) timestamp(num protowire.Number, t time.Time) {
	secs, nanos := uint64(t.Unix()), uint64(int64(int32(t.Nanosecond())))
	size := 0
	if secs != 0 {
		size += protowire.SizeTag(1) + protowire.SizeVarint(secs)
	}
	if nanos != 0 {
		size += protowire.SizeTag(2) + protowire.SizeVarint(nanos)
	}
	e.b = protowire.AppendTag(e.b, num, protowire.BytesType)
	e.b = protowire.AppendVarint(e.b, uint64(size))
	e.varint(1, secs)
	e.varint(2, nanos)
}

type timestamp struct {
	seconds int64
	nanos   int32
}

// merge applies one occurrence of an embedded Timestamp; repeated occurrences
// merge field by field, as the protobuf runtime does.
func (ts *timestamp) merge(name string, b []byte) error {
	err := walk(b, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
		if typ != protowire.VarintType {
			return nil
		}
		switch num {
		case 1:
			ts.seconds = int64(x)
		case 2:
			ts.nanos = int32(x)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// time converts like timestamppb's AsTime: Unix(seconds, nanos) in UTC, so
// seconds -62135596800 gives back the Go zero time (IsZero is true).
func (ts timestamp) time() time.Time {
	return time.Unix(ts.seconds, int64(ts.nanos)).UTC()
}

func utf8Field(name string, v []byte) (string, error) {
	if !utf8.Valid(v) {
		return "", fmt.Errorf("field %s: %w", name, errInvalidUTF8)
	}
	return string(v), nil
}

// walk calls fn for every field of one message level. v holds the value of
// length-delimited fields, x the value of varint and fixed fields. Groups are
// skipped as unknown fields. Any structural error wraps ErrMalformed.
func walk(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: bad tag: %v", ErrMalformed, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: field number %d out of range", ErrMalformed, num)
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var f uint32
			f, n = protowire.ConsumeFixed32(b)
			x = uint64(f)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", ErrMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
