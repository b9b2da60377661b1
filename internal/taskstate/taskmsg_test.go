package taskstate

import (
	"bytes"
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func fullTaskMessage() *TaskMessage {
	return &TaskMessage{
		Type:         "report:daily",
		Payload:      []byte{0, 1, 0xff, 'x'},
		ID:           "cronstream:e1:1700000000",
		Queue:        "critical",
		Retry:        25,
		Retried:      3,
		ErrorMsg:     "asynq: task lease expired",
		Timeout:      1800,
		Deadline:     1700003600,
		UniqueKey:    "asynq:{critical}:unique:report:daily:abc",
		LastFailedAt: 1700000100,
		Retention:    86400,
		CompletedAt:  1700000200,
		GroupKey:     "g1",
		Headers:      map[string]string{"source": "cron", "b": "", "": "empty-key"},
	}
}

func TestTaskMessageRoundTrip(t *testing.T) {
	t.Parallel()
	cases := map[string]*TaskMessage{
		"full":     fullTaskMessage(),
		"empty":    {},
		"negative": {Type: "t", Retry: -1, Retried: -5, Timeout: -3, Deadline: -1},
		"unicode":  {Type: "τ", Queue: "a:b", ID: "x{y}", Headers: map[string]string{"ключ": "значение"}},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeTaskMessage(m)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := DecodeTaskMessage(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			assertTaskMessageEqual(t, m, got)
			again, err := EncodeTaskMessage(got)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if !bytes.Equal(b, again) {
				t.Fatalf("encoding not deterministic:\n%x\n%x", b, again)
			}
		})
	}
}

func assertTaskMessageEqual(t *testing.T, want, got *TaskMessage) {
	t.Helper()
	w, g := *want, *got
	if len(w.Payload) == 0 && len(g.Payload) == 0 {
		w.Payload, g.Payload = nil, nil
	}
	if len(w.Headers) == 0 && len(g.Headers) == 0 {
		w.Headers, g.Headers = nil, nil
	}
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("task message mismatch\nwant %+v\ngot  %+v", w, g)
	}
}

func TestEncodeTaskMessageFieldOrderAndDefaults(t *testing.T) {
	t.Parallel()
	b, err := EncodeTaskMessage(&TaskMessage{Type: "t", ID: "i", Queue: "default", Retry: 25, Timeout: 1800,
		Headers: map[string]string{"z": "1", "a": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	var nums []protowire.Number
	var headerKeys []string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if num == 15 {
			v, _ := protowire.ConsumeBytes(b)
			_, _, tn := protowire.ConsumeTag(v)
			k, _ := protowire.ConsumeString(v[tn:])
			headerKeys = append(headerKeys, k)
		}
		b = b[n:]
		nums = append(nums, num)
	}
	want := []protowire.Number{1, 3, 4, 5, 8, 15, 15}
	if !reflect.DeepEqual(nums, want) {
		t.Fatalf("field order %v, want %v", nums, want)
	}
	if !reflect.DeepEqual(headerKeys, []string{"a", "z"}) {
		t.Fatalf("header order %v, want sorted", headerKeys)
	}
}

func TestTaskMessageInvalidUTF8(t *testing.T) {
	t.Parallel()
	bad := string([]byte{0xff, 0xfe})
	for name, m := range map[string]*TaskMessage{
		"type":         {Type: bad},
		"id":           {ID: bad},
		"queue":        {Queue: bad},
		"error_msg":    {ErrorMsg: bad},
		"unique_key":   {UniqueKey: bad},
		"group_key":    {GroupKey: bad},
		"header key":   {Headers: map[string]string{bad: "v"}},
		"header value": {Headers: map[string]string{"k": bad}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := EncodeTaskMessage(m); !errors.Is(err, ErrMalformed) {
				t.Fatalf("encode err = %v, want ErrMalformed", err)
			}
			// Build the same bytes by hand and check the decoder refuses them.
			raw := rawTaskMessage(m)
			if _, err := DecodeTaskMessage(raw); !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode err = %v, want ErrMalformed", err)
			}
		})
	}
	// Payload is bytes, not string: anything goes.
	if _, err := EncodeTaskMessage(&TaskMessage{Payload: []byte(bad)}); err != nil {
		t.Fatalf("payload with invalid UTF-8: %v", err)
	}
}

// rawTaskMessage encodes string fields without validation, to produce bytes
// that asynq's decoder would refuse.
func rawTaskMessage(m *TaskMessage) []byte {
	var b []byte
	add := func(num protowire.Number, s string) {
		if s != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, s)
		}
	}
	add(1, m.Type)
	add(3, m.ID)
	add(4, m.Queue)
	add(7, m.ErrorMsg)
	add(10, m.UniqueKey)
	add(14, m.GroupKey)
	for k, v := range m.Headers {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		b = protowire.AppendTag(b, 15, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

func TestDecodeTaskMessageMalformedAndUnknown(t *testing.T) {
	t.Parallel()
	good, _ := EncodeTaskMessage(&TaskMessage{Type: "t", ID: "i"})
	// Unknown fields of every wire type are skipped.
	var unk []byte
	unk = protowire.AppendTag(unk, 99, protowire.VarintType)
	unk = protowire.AppendVarint(unk, 7)
	unk = protowire.AppendTag(unk, 100, protowire.Fixed32Type)
	unk = protowire.AppendFixed32(unk, 7)
	unk = protowire.AppendTag(unk, 101, protowire.Fixed64Type)
	unk = protowire.AppendFixed64(unk, 7)
	unk = protowire.AppendTag(unk, 102, protowire.StartGroupType)
	unk = protowire.AppendTag(unk, 1, protowire.VarintType)
	unk = protowire.AppendVarint(unk, 1)
	unk = protowire.AppendTag(unk, 102, protowire.EndGroupType)
	// A known field with the wrong wire type is an unknown field too.
	unk = protowire.AppendTag(unk, 1, protowire.VarintType)
	unk = protowire.AppendVarint(unk, 5)
	m, err := DecodeTaskMessage(append(append([]byte{}, good...), unk...))
	if err != nil {
		t.Fatalf("unknown fields: %v", err)
	}
	if m.Type != "t" || m.ID != "i" {
		t.Fatalf("got %+v", m)
	}
	if m, err := DecodeTaskMessage(nil); err != nil || !reflect.DeepEqual(m, &TaskMessage{}) {
		t.Fatalf("empty input: %+v, %v", m, err)
	}
	for name, b := range map[string][]byte{
		"truncated length": {0x0a, 0x05, 'a'},
		"bad varint":       {0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"field zero":       {0x00, 0x01},
		"lone end group":   {0x0c},
		"truncated tag":    {0x80},
		"bad header entry": {0x7a, 0x02, 0x0a, 0x05},
	} {
		if _, err := DecodeTaskMessage(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func TestSchedulerEntryRoundTrip(t *testing.T) {
	t.Parallel()
	next := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	cases := map[string]*SchedulerEntry{
		"full": {ID: "e1", Spec: "0 9 * * *", TaskType: "report", TaskPayload: []byte("{}"),
			EnqueueOptions: []string{`Queue("critical")`, "MaxRetry(5)", ""}, Next: next, Prev: next.Add(-24*time.Hour + 5)},
		"never fired": {ID: "e2", Spec: "@every 1m", TaskType: "x", Next: next},
		"epoch":       {ID: "e3", Next: time.Unix(0, 0).UTC(), Prev: time.Unix(0, 0).UTC()},
	}
	for name, se := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeSchedulerEntry(se)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeSchedulerEntry(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != se.ID || got.Spec != se.Spec || got.TaskType != se.TaskType ||
				!bytes.Equal(got.TaskPayload, se.TaskPayload) || !slicesEqual(got.EnqueueOptions, se.EnqueueOptions) ||
				!got.Next.Equal(se.Next) || !got.Prev.Equal(se.Prev) {
				t.Fatalf("mismatch\nwant %+v\ngot  %+v", se, got)
			}
			if se.Prev.IsZero() && !got.Prev.IsZero() {
				t.Fatalf("zero Prev decoded as %v", got.Prev)
			}
		})
	}
}

func slicesEqual(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

func TestZeroTimestampEncoding(t *testing.T) {
	t.Parallel()
	// docs/asynq-compat.md "Timestamps": the zero time is written, as seconds -62135596800.
	b, err := EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{TaskID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(timestamppb.New(time.Time{}))
	wantBody, _ := proto.Marshal(want)
	var exp []byte
	exp = protowire.AppendTag(exp, 1, protowire.BytesType)
	exp = protowire.AppendString(exp, "t")
	exp = protowire.AppendTag(exp, 2, protowire.BytesType)
	exp = protowire.AppendBytes(exp, wantBody)
	if !bytes.Equal(b, exp) {
		t.Fatalf("zero time encoding\n got %x\nwant %x", b, exp)
	}
	ev, err := DecodeSchedulerEnqueueEvent(b)
	if err != nil || !ev.EnqueueTime.IsZero() || ev.EnqueueTime != (time.Time{}) {
		t.Fatalf("decode: %+v %v", ev, err)
	}
	// An omitted timestamp reads as the Unix epoch, as asynq's readers see it.
	ev, err = DecodeSchedulerEnqueueEvent(exp[:3])
	if err != nil || !ev.EnqueueTime.Equal(time.Unix(0, 0)) {
		t.Fatalf("omitted timestamp: %+v %v", ev, err)
	}
}

func TestSchedulerEnqueueEventRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 2, 3, 4, 5, 6, 789, time.FixedZone("X", 3600))
	b, err := EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{TaskID: "id-1", EnqueueTime: at})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := DecodeSchedulerEnqueueEvent(b)
	if err != nil || ev.TaskID != "id-1" || !ev.EnqueueTime.Equal(at) {
		t.Fatalf("got %+v %v", ev, err)
	}
	if _, err := EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{TaskID: "\xff"}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("invalid UTF-8 accepted: %v", err)
	}
	if _, err := EncodeSchedulerEntry(&SchedulerEntry{EnqueueOptions: []string{"\xff"}}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("invalid UTF-8 option accepted: %v", err)
	}
}

// --- differential check against the Go protobuf runtime -------------------

// asynqDescriptors builds asynq.proto's three messages as dynamic descriptors,
// so the official protobuf runtime can decode and encode the same bytes as
// ours. This is the reference asynq itself runs on.
func asynqDescriptors(t testing.TB) (task, entry, event protoreflect.MessageDescriptor) {
	t.Helper()
	s := func(v string) *string { return &v }
	i := func(v int32) *int32 { return &v }
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	rep := descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	typ := func(k descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto_Type { return &k }
	const (
		tString = descriptorpb.FieldDescriptorProto_TYPE_STRING
		tBytes  = descriptorpb.FieldDescriptorProto_TYPE_BYTES
		tInt32  = descriptorpb.FieldDescriptorProto_TYPE_INT32
		tInt64  = descriptorpb.FieldDescriptorProto_TYPE_INT64
		tMsg    = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
	)
	f := func(name string, num int32, k descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: s(name), JsonName: s(name), Number: i(num), Label: opt, Type: typ(k)}
	}
	headers := f("headers", 15, tMsg)
	headers.Label = rep
	headers.TypeName = s(".asynq.TaskMessage.HeadersEntry")
	options := f("enqueue_options", 5, tString)
	options.Label = rep
	tsField := func(name string, num int32) *descriptorpb.FieldDescriptorProto {
		x := f(name, num, tMsg)
		x.TypeName = s(".google.protobuf.Timestamp")
		return x
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name: s("asynq_test.proto"), Package: s("asynq"), Syntax: s("proto3"),
		Dependency: []string{"google/protobuf/timestamp.proto"},
		MessageType: []*descriptorpb.DescriptorProto{
			{
				Name: s("TaskMessage"),
				Field: []*descriptorpb.FieldDescriptorProto{
					f("type", 1, tString), f("payload", 2, tBytes), headers, f("id", 3, tString),
					f("queue", 4, tString), f("retry", 5, tInt32), f("retried", 6, tInt32),
					f("error_msg", 7, tString), f("last_failed_at", 11, tInt64), f("timeout", 8, tInt64),
					f("deadline", 9, tInt64), f("unique_key", 10, tString), f("group_key", 14, tString),
					f("retention", 12, tInt64), f("completed_at", 13, tInt64),
				},
				NestedType: []*descriptorpb.DescriptorProto{{
					Name:    s("HeadersEntry"),
					Field:   []*descriptorpb.FieldDescriptorProto{f("key", 1, tString), f("value", 2, tString)},
					Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
				}},
			},
			{
				Name: s("SchedulerEntry"),
				Field: []*descriptorpb.FieldDescriptorProto{
					f("id", 1, tString), f("spec", 2, tString), f("task_type", 3, tString),
					f("task_payload", 4, tBytes), options, tsField("next_enqueue_time", 6), tsField("prev_enqueue_time", 7),
				},
			},
			{
				Name:  s("SchedulerEnqueueEvent"),
				Field: []*descriptorpb.FieldDescriptorProto{f("task_id", 1, tString), tsField("enqueue_time", 2)},
			},
		},
	}
	file, err := protodesc.NewFile(fd, protoregistryFiles(t))
	if err != nil {
		t.Fatalf("build descriptors: %v", err)
	}
	msgs := file.Messages()
	return msgs.ByName("TaskMessage"), msgs.ByName("SchedulerEntry"), msgs.ByName("SchedulerEnqueueEvent")
}

// referenceTaskMessage decodes b with the protobuf runtime into our struct.
func referenceTaskMessage(md protoreflect.MessageDescriptor, b []byte) (*TaskMessage, error) {
	dm := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, dm); err != nil {
		return nil, err
	}
	get := func(name string) protoreflect.Value { return dm.Get(md.Fields().ByName(protoreflect.Name(name))) }
	m := &TaskMessage{
		Type: get("type").String(), Payload: get("payload").Bytes(), ID: get("id").String(),
		Queue: get("queue").String(), Retry: int32(get("retry").Int()), Retried: int32(get("retried").Int()),
		ErrorMsg: get("error_msg").String(), Timeout: get("timeout").Int(), Deadline: get("deadline").Int(),
		UniqueKey: get("unique_key").String(), LastFailedAt: get("last_failed_at").Int(),
		Retention: get("retention").Int(), CompletedAt: get("completed_at").Int(), GroupKey: get("group_key").String(),
	}
	hm := get("headers").Map()
	if hm.Len() > 0 {
		m.Headers = map[string]string{}
		hm.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			m.Headers[k.String()] = v.String()
			return true
		})
	}
	return m, nil
}

func TestTaskMessageMatchesProtobufRuntime(t *testing.T) {
	t.Parallel()
	md, _, _ := asynqDescriptors(t)
	ours, err := EncodeTaskMessage(fullTaskMessage())
	if err != nil {
		t.Fatal(err)
	}
	ref, err := referenceTaskMessage(md, ours)
	if err != nil {
		t.Fatalf("runtime cannot decode our bytes: %v", err)
	}
	assertTaskMessageEqual(t, fullTaskMessage(), ref)
	// The runtime's deterministic encoding of the same message equals ours
	// (it, too, sorts map keys when deterministic).
	dm := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(ours, dm); err != nil {
		t.Fatal(err)
	}
	theirs, err := proto.MarshalOptions{Deterministic: true}.Marshal(dm)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, theirs) {
		t.Fatalf("encoding differs from protobuf runtime\nours   %x\ntheirs %x", ours, theirs)
	}
	if !maps.Equal(ref.Headers, fullTaskMessage().Headers) {
		t.Fatalf("headers %v", ref.Headers)
	}
}

func TestSchedulerMessagesMatchProtobufRuntime(t *testing.T) {
	t.Parallel()
	_, emd, vmd := asynqDescriptors(t)
	se := &SchedulerEntry{ID: "e", Spec: "* * * * *", TaskType: "t", TaskPayload: []byte("p"),
		EnqueueOptions: []string{"MaxRetry(1)", `Queue("q")`}, Next: time.Unix(1700000000, 5).UTC()}
	for _, c := range []struct {
		md  protoreflect.MessageDescriptor
		enc func() ([]byte, error)
	}{
		{emd, func() ([]byte, error) { return EncodeSchedulerEntry(se) }},
		{vmd, func() ([]byte, error) { return EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{TaskID: "x"}) }},
	} {
		ours, err := c.enc()
		if err != nil {
			t.Fatal(err)
		}
		dm := dynamicpb.NewMessage(c.md)
		if err := proto.Unmarshal(ours, dm); err != nil {
			t.Fatalf("%s: runtime cannot decode: %v", c.md.Name(), err)
		}
		theirs, _ := proto.MarshalOptions{Deterministic: true}.Marshal(dm)
		if !bytes.Equal(ours, theirs) {
			t.Fatalf("%s encoding differs\nours   %x\ntheirs %x", c.md.Name(), ours, theirs)
		}
	}
}

// TestTaskMessageSizeExact: EncodeTaskMessage allocates exactly what it
// writes, for every field's size class (lengths and varints of one to ten
// bytes, negative int32s, empty header values).
func TestTaskMessageSizeExact(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	text := func(max int) string { return strings.Repeat("x", rng.IntN(max+1)) }
	nums := []int64{0, 1, 127, 128, 16383, 16384, 1 << 35, -1, 1<<63 - 1}
	for range 2000 {
		m := &TaskMessage{
			Type: text(3), Payload: []byte(text(300)), ID: text(200), Queue: text(2),
			Retry: int32(nums[rng.IntN(len(nums))]), Retried: int32(nums[rng.IntN(len(nums))]),
			ErrorMsg: text(130), Timeout: nums[rng.IntN(len(nums))], Deadline: nums[rng.IntN(len(nums))],
			UniqueKey: text(20), LastFailedAt: nums[rng.IntN(len(nums))], Retention: nums[rng.IntN(len(nums))],
			CompletedAt: nums[rng.IntN(len(nums))], GroupKey: text(2),
		}
		for i := range rng.IntN(4) {
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[strings.Repeat("k", i)+text(140)] = text(140)
		}
		b, err := EncodeTaskMessage(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != taskMessageSize(m) || cap(b) != len(b) {
			t.Fatalf("encoded %d bytes in a buffer of %d; size computed %d", len(b), cap(b), taskMessageSize(m))
		}
	}
}
