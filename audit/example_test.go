package audit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/audit"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// exampleStreams starts an embedded NATS server with JetStream so the
// examples run on their own (in a program, connect to your NATS instead),
// creates the streams, registers two entries and stores a fire of one of
// them, as a replica would.
func exampleStreams() (js jetstream.JetStream, c *events.Client, stop func()) {
	js, stop, err := testenv.RunJetStream()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	names := events.MustNames("")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		stop()
		log.Fatal(err)
	}
	c = events.NewClient(js, names, events.WithSource("cronstream/cli/alice"))
	for _, e := range []events.Entry{
		{ID: "daily-report", Cron: "0 9 * * *", Task: events.Task{Type: "report:daily"}, Options: events.Options{Queue: "reports"}},
		{ID: "cache-warm", Cron: "*/5 * * * *", Task: events.Task{Type: "cache:warm"}},
	} {
		if _, err := c.Put(ctx, e); err != nil {
			stop()
			log.Fatal(err)
		}
	}
	tick := time.Date(2026, 3, 12, 9, 0, 0, 0, time.UTC)
	ev, err := events.NewEventAt("fire:daily-report:1773306000", tick, events.TypeEntryFired, "cronstream/replica-1", "daily-report", events.Fired{
		Entry: "daily-report", ScheduledAt: tick, EnqueuedAt: tick, TaskID: "cronstream:daily-report:2026-03-12T09:00:00Z", Queue: "reports", Revision: 1, Replica: "replica-1"})
	if err != nil {
		stop()
		log.Fatal(err)
	}
	b, err := ev.Marshal()
	if err != nil {
		stop()
		log.Fatal(err)
	}
	if _, err := js.Publish(ctx, names.FireSubject("daily-report"), b); err != nil {
		stop()
		log.Fatal(err)
	}
	return js, c, stop
}

// Replay both streams, config changes and activity, in the order they
// were stored. io.EOF ends the history.
func Example() {
	js, _, stop := exampleStreams()
	defer stop()
	ctx := context.Background()

	r, err := audit.Open(ctx, js, audit.Params{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		if rec.Err != nil { // stored, but not a CloudEvent
			fmt.Println(rec.Stream, rec.Seq, "malformed:", rec.Err)
			continue
		}
		fmt.Println(rec.Stream, rec.Seq, rec.Event.Type, rec.Event.Subject)
	}
	// Output:
	// CRONSTREAM_CONFIG 1 cronstream.entry.registered daily-report
	// CRONSTREAM_CONFIG 2 cronstream.entry.registered cache-warm
	// CRONSTREAM_ACTIVITY 1 cronstream.entry.fired daily-report
}

// Filters combine as `cronstream audit`'s flags do: here the events that
// concern one asynq queue, of some types.
func ExampleParams() {
	js, _, stop := exampleStreams()
	defer stop()
	ctx := context.Background()

	r, err := audit.Open(ctx, js, audit.Params{
		Queue: "reports",
		Types: []string{"fired", "entry.registered"}, // short, partial or full names, or globs ("entry.*")
		Since: time.Now().Add(-time.Hour),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		if rec.Event.Type == events.TypeEntryFired {
			var f events.Fired
			if err := rec.Event.DecodeData(&f); err != nil {
				log.Fatal(err)
			}
			fmt.Println("fired", f.TaskID, "into", f.Queue)
			continue
		}
		fmt.Println(events.ShortType(rec.Event.Type), rec.Event.Subject)
	}
	// Output:
	// registered daily-report
	// fired cronstream:daily-report:2026-03-12T09:00:00Z into reports
}

// With Follow, the io.EOF after the history is a marker: the calls after
// it wait for what either stream stores next, until their context ends.
func ExampleReader_Next_follow() {
	js, c, stop := exampleStreams()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r, err := audit.Open(ctx, js, audit.Params{Entry: "cache-warm", Follow: true})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			fmt.Println("-- the history is read; following")
			if _, err := c.Pause(ctx, "cache-warm", "deploy"); err != nil {
				log.Fatal(err)
			}
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(rec.Event.Type, rec.Event.Subject, "by", rec.Event.Source)
		if rec.Event.Type == events.TypeEntryPaused {
			break
		}
	}
	// Output:
	// cronstream.entry.registered cache-warm by cronstream/cli/alice
	// -- the history is read; following
	// cronstream.entry.paused cache-warm by cronstream/cli/alice
}
