package taskstate

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestOutboxOrderAndOwnership: records come out in order with their event
// ids; only the lease owner acks; a second owner takes over after the lease
// expired and resumes from the first unacknowledged record.
func TestOutboxOrderAndOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	var want []string
	for i := 1; i <= 5; i++ {
		var prev time.Time
		if i > 1 {
			prev = tickAt(i - 1)
		}
		mustFire(t, s, tickFire("ob", "default", tickAt(i), prev), StatusFired)
		want = append(want, record("fired", "ob", tickAt(i)).ID)
	}
	if n, err := s.OutboxLen(ctx, testPrefix, "default"); err != nil || n != 5 {
		t.Fatalf("OutboxLen = %d, %v; want 5", n, err)
	}
	if qs, err := s.OutboxQueues(ctx, testPrefix); err != nil || !slices.Equal(qs, []string{"default"}) {
		t.Fatalf("OutboxQueues = %v, %v", qs, err)
	}

	// Paging with "after" returns every record once, in order, with data.
	var got []OutboxRecord
	after := ""
	for {
		page, err := s.ReadOutbox(ctx, testPrefix, "default", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		got = append(got, page...)
		after = page[len(page)-1].StreamID
	}
	if len(got) != 5 {
		t.Fatalf("read %d records, want 5", len(got))
	}
	for i, r := range got {
		if r.EventID != want[i] || string(r.Data) != string(record("fired", "ob", tickAt(i+1)).Data) || r.StreamID == "" {
			t.Fatalf("record %d = %+v, want event %q", i, r, want[i])
		}
	}

	const ttl = 300 * time.Millisecond
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "relay-1", ttl); err != nil || !ok {
		t.Fatalf("relay-1 acquire: %v, %v", ok, err)
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "relay-2", ttl); err != nil || ok {
		t.Fatalf("relay-2 acquired a held outbox: %v, %v", ok, err)
	}
	if err := s.AckOutbox(ctx, testPrefix, "default", "relay-2", time.Minute, got[0].StreamID); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("ack by non-owner: %v, want ErrNotOwner", err)
	}
	if n, _ := s.OutboxLen(ctx, testPrefix, "default"); n != 5 {
		t.Fatalf("non-owner ack deleted records: %d left", n)
	}
	if err := s.AckOutbox(ctx, testPrefix, "default", "relay-1", ttl, got[0].StreamID, got[1].StreamID); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "relay-1", ttl); err != nil || !ok {
		t.Fatalf("relay-1 renew: %v, %v", ok, err)
	}

	// relay-1 stops renewing (it died): relay-2 takes over after the ttl.
	testenv.Eventually(t, 5*time.Second, func() bool {
		ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "relay-2", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}, "relay-2 takes over the outbox")
	resumed, err := s.ReadOutbox(ctx, testPrefix, "default", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(resumed) != 3 || resumed[0].EventID != want[2] {
		t.Fatalf("relay-2 resumes at %+v, want %q first of 3", resumed, want[2])
	}
	// The old owner, back from a pause, can no longer ack.
	if err := s.AckOutbox(ctx, testPrefix, "default", "relay-1", ttl, resumed[0].StreamID); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("ack by former owner: %v, want ErrNotOwner", err)
	}
	if err := s.AckOutbox(ctx, testPrefix, "default", "relay-2", time.Minute, resumed[0].StreamID); err != nil {
		t.Fatal(err)
	}
	// Release hands over at once.
	if err := s.ReleaseOutbox(ctx, testPrefix, "default", "relay-1"); err != nil { // not the owner: no-op
		t.Fatal(err)
	}
	if ok, _ := s.AcquireOutbox(ctx, testPrefix, "default", "relay-1", ttl); ok {
		t.Fatal("release by a non-owner freed the lease")
	}
	if err := s.ReleaseOutbox(ctx, testPrefix, "default", "relay-2"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "relay-1", ttl); err != nil || !ok {
		t.Fatalf("acquire after release: %v, %v", ok, err)
	}
	left, err := s.ReadOutbox(ctx, testPrefix, "default", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0].EventID != want[3] || left[1].EventID != want[4] {
		t.Fatalf("records left %+v, want the last two", left)
	}
}

// TestOutboxAckMany acks more ids than one XDEL call takes.
func TestOutboxAckMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	s.firePath = pathEach // a record per fire
	var fires []Fire
	for i := range 1200 {
		fires = append(fires, tickFire("m"+string(rune('a'+i%26))+string(rune('a'+i/26)), "default", tickAt(1), time.Time{}))
	}
	if _, err := s.FireBatch(ctx, testFences, fires); err != nil {
		t.Fatal(err)
	}
	recs, err := s.ReadOutbox(ctx, testPrefix, "default", "", 2000)
	if err != nil || len(recs) != 1200 {
		t.Fatalf("read %d records: %v", len(recs), err)
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.StreamID
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "r", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := s.AckOutbox(ctx, testPrefix, "default", "r", time.Minute, ids...); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.OutboxLen(ctx, testPrefix, "default"); n != 0 {
		t.Fatalf("%d records left", n)
	}
}

// TestOutboxAckAfterLapse: a relay whose pass outlasted its lease still
// deletes what it published when nobody took the outbox meanwhile, and
// holds the lease again; once another relay took it, its ack deletes
// nothing. A renewal extends the holder's lease only.
func TestOutboxAckAfterLapse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newTestStore(t)
	for i := 1; i <= 3; i++ {
		var prev time.Time
		if i > 1 {
			prev = tickAt(i - 1)
		}
		mustFire(t, s, tickFire("lapse", "default", tickAt(i), prev), StatusFired)
	}
	recs, err := s.ReadOutbox(ctx, testPrefix, "default", "", 3)
	if err != nil || len(recs) != 3 {
		t.Fatalf("read %d records: %v", len(recs), err)
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "slow", 20*time.Millisecond); err != nil || !ok {
		t.Fatalf("acquire: %v, %v", ok, err)
	}
	time.Sleep(50 * time.Millisecond) // the pass outlasts the lease
	if err := s.AckOutbox(ctx, testPrefix, "default", "slow", time.Minute, recs[0].StreamID); err != nil {
		t.Fatalf("ack after a lapse nobody took: %v", err)
	}
	if n, _ := s.OutboxLen(ctx, testPrefix, "default"); n != 2 {
		t.Fatalf("%d records left, want 2", n)
	}
	if ok, _ := s.AcquireOutbox(ctx, testPrefix, "default", "other", time.Minute); ok {
		t.Fatal("the ack did not take the lapsed lease again: another relay took it")
	}
	if err := s.ReleaseOutbox(ctx, testPrefix, "default", "slow"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AcquireOutbox(ctx, testPrefix, "default", "other", time.Minute); err != nil || !ok {
		t.Fatalf("other acquire: %v, %v", ok, err)
	}
	if err := s.AckOutbox(ctx, testPrefix, "default", "slow", time.Minute, recs[1].StreamID); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("ack while another relay holds the lease: %v, want ErrNotOwner", err)
	}
	if n, _ := s.OutboxLen(ctx, testPrefix, "default"); n != 2 {
		t.Fatalf("%d records left after a refused ack, want 2", n)
	}
	// Renewing extends the holder's lease only, and never takes a free one.
	if ok, err := s.RenewOutbox(ctx, testPrefix, "default", "slow", time.Minute); err != nil || ok {
		t.Fatalf("renew by a relay that does not hold the lease: %v, %v", ok, err)
	}
	if ok, err := s.RenewOutbox(ctx, testPrefix, "default", "other", time.Minute); err != nil || !ok {
		t.Fatalf("renew by the holder: %v, %v", ok, err)
	}
	if err := s.ReleaseOutbox(ctx, testPrefix, "default", "other"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.RenewOutbox(ctx, testPrefix, "default", "other", time.Minute); err != nil || ok {
		t.Fatalf("renew of a released lease took it: %v, %v", ok, err)
	}
}
