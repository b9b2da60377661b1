package taskstate

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func protoregistryFiles(testing.TB) *protoregistry.Files {
	// Importing timestamppb registers google/protobuf/timestamp.proto.
	_ = timestamppb.Now
	return protoregistry.GlobalFiles
}

func taskSeeds(f *testing.F) {
	for _, m := range []*TaskMessage{fullTaskMessage(), {}, {Type: "t", Retry: -1}} {
		b, err := EncodeTaskMessage(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{0x7a, 0x04, 0x0a, 0x02, 0xff, 0xfe})
	f.Add([]byte{0x13, 0x08, 0x01, 0x14})
}

// FuzzDecodeTaskMessage checks that the decoder never panics and agrees with
// the Go protobuf runtime (the decoder asynq uses) on every input: both accept
// or both refuse, and accepted messages have equal fields.
func FuzzDecodeTaskMessage(f *testing.F) {
	taskSeeds(f)
	md, _, _ := asynqDescriptors(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		ours, err := DecodeTaskMessage(b)
		ref, refErr := referenceTaskMessage(md, b)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("disagree on %x: ours err=%v, runtime err=%v", b, err, refErr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		assertTaskMessageEqual(t, ref, ours)
		// What we decode, we can encode, and it decodes to the same thing.
		again, err := EncodeTaskMessage(ours)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := DecodeTaskMessage(again)
		if err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		assertTaskMessageEqual(t, ours, back)
	})
}

func dynamicTime(dm *dynamicpb.Message, name string) time.Time {
	fd := dm.Descriptor().Fields().ByName(protoreflect.Name(name))
	ts := dm.Get(fd).Message()
	f := ts.Descriptor().Fields()
	return time.Unix(ts.Get(f.ByName("seconds")).Int(), ts.Get(f.ByName("nanos")).Int()).UTC()
}

func FuzzDecodeSchedulerEntry(f *testing.F) {
	for _, se := range []*SchedulerEntry{
		{ID: "e", Spec: "@daily", TaskType: "t", EnqueueOptions: []string{"MaxRetry(1)"}, Next: time.Unix(1e9, 3)},
		{},
	} {
		b, _ := EncodeSchedulerEntry(se)
		f.Add(b)
	}
	f.Add([]byte{0x32, 0x02, 0x08, 0x01, 0x32, 0x02, 0x10, 0x05})
	_, md, _ := asynqDescriptors(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		ours, err := DecodeSchedulerEntry(b)
		dm := dynamicpb.NewMessage(md)
		refErr := proto.Unmarshal(b, dm)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("disagree on %x: ours err=%v, runtime err=%v", b, err, refErr)
		}
		if err != nil {
			return
		}
		fields := md.Fields()
		if ours.ID != dm.Get(fields.ByName("id")).String() || ours.Spec != dm.Get(fields.ByName("spec")).String() ||
			ours.TaskType != dm.Get(fields.ByName("task_type")).String() ||
			string(ours.TaskPayload) != string(dm.Get(fields.ByName("task_payload")).Bytes()) ||
			dm.Get(fields.ByName("enqueue_options")).List().Len() != len(ours.EnqueueOptions) ||
			!ours.Next.Equal(dynamicTime(dm, "next_enqueue_time")) || !ours.Prev.Equal(dynamicTime(dm, "prev_enqueue_time")) {
			t.Fatalf("field mismatch on %x: ours %+v", b, ours)
		}
		if _, err := EncodeSchedulerEntry(ours); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

func FuzzDecodeSchedulerEnqueueEvent(f *testing.F) {
	b, _ := EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{TaskID: "x", EnqueueTime: time.Unix(5, 6)})
	f.Add(b)
	b, _ = EncodeSchedulerEnqueueEvent(&SchedulerEnqueueEvent{})
	f.Add(b)
	_, _, md := asynqDescriptors(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		ours, err := DecodeSchedulerEnqueueEvent(b)
		dm := dynamicpb.NewMessage(md)
		refErr := proto.Unmarshal(b, dm)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("disagree on %x: ours err=%v, runtime err=%v", b, err, refErr)
		}
		if err != nil {
			return
		}
		if ours.TaskID != dm.Get(md.Fields().ByName("task_id")).String() || !ours.EnqueueTime.Equal(dynamicTime(dm, "enqueue_time")) {
			t.Fatalf("field mismatch on %x: %+v", b, ours)
		}
	})
}
