package replica

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestReplicaIDIsABucketKey: events.ValidateReplicaID accepts exactly the
// ids a real NATS KV bucket takes as keys (a replica's heartbeat is keyed
// by its id), and Run refuses an id it rejects at once instead of retrying
// a heartbeat that cannot be written.
func TestReplicaIDIsABucketKey(t *testing.T) {
	ns := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := ns.JetStream(t).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.MustNames("ids").ReplicasBucket()})
	if err != nil {
		t.Fatal(err)
	}
	host := DefaultReplicaID()
	for _, id := range []string{
		host, "cronstream-1", "web-1-4242-a1b2c3", "pod.ns", "a/b=c_d", "A", "2b7d7b5e-2f6a-4fd1-9b7d-aa0011223344",
		"", "a:b", "a b", ".a", "a.", "a..b", "a*", "a>", "é", "a\nb",
	} {
		_, putErr := kv.Put(ctx, id, []byte("{}"))
		valid := events.ValidateReplicaID(id)
		if (putErr == nil) != (valid == nil) {
			t.Errorf("id %q: the bucket says %v, ValidateReplicaID %v", id, putErr, valid)
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = Run(runCtx, Config{NATSURL: ns.URL(), Redis: testenv.StartRedis(t).Client(t), Names: events.MustNames("ids"), ReplicaID: "web:1", Logger: quietLogger()})
	if err == nil || runCtx.Err() != nil || !strings.Contains(err.Error(), `replica id "web:1"`) {
		t.Fatalf("Run with replica id web:1 = %v, want its refusal at once", err)
	}
}
