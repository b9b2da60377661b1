package asynqimport

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}

func TestStartAt(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		last, next time.Time
		want       time.Time
		basis      string
	}{
		{last: at("2026-03-01T09:00:00.004Z"), next: at("2026-03-02T09:00:00Z"), want: at("2026-03-01T09:00:01Z"), basis: BasisHistory},
		{last: at("2026-03-01T09:00:00Z"), want: at("2026-03-01T09:00:01Z"), basis: BasisHistory},
		{last: at("2026-03-01T10:00:00.5+01:00"), want: at("2026-03-01T09:00:01Z"), basis: BasisHistory},
		{next: at("2026-03-02T09:00:00Z"), want: at("2026-03-02T09:00:00Z"), basis: BasisNextRun},
		{},
	} {
		got, basis := StartAt(c.last, c.next)
		if !got.Equal(c.want) || basis != c.basis || got.Location() != time.UTC && !got.IsZero() {
			t.Errorf("StartAt(%s, %s) = %s (%s), want %s (%s)", c.last, c.next, got, basis, c.want, c.basis)
		}
	}
}

// TestReadAsRun: a spec asynq runs as another (a fractional @every) is
// imported as asynq runs it, with a warning; an entry that fits every
// zone gets no time zone warning.
func TestReadAsRun(t *testing.T) {
	rc := testenv.StartRedis(t).Client(t)
	s := asynq.NewSchedulerFromRedisClient(rc, &asynq.SchedulerOpts{HeartbeatInterval: time.Second, LogLevel: asynq.FatalLevel})
	if _, err := s.Register("@every 1500ms", asynq.NewTask("fast", nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	var r Result
	testenv.Eventually(t, 10*time.Second, func() bool {
		var err error
		r, err = Read(context.Background(), taskstate.New(rc), Options{})
		return err == nil && len(r.Entries) == 1
	}, "not read")
	e := r.Entries[0]
	if e.Entry.Cron != "@every 1s" || len(e.Sources) != 1 || e.Sources[0].Spec != "@every 1500ms" {
		t.Fatalf("imported %+v", e)
	}
	warned := strings.Join(e.Warnings, "\n")
	if !strings.Contains(warned, `asynq runs as "@every 1s"`) || strings.Contains(warned, "time zone") {
		t.Fatalf("warnings:\n%s", warned)
	}
}
