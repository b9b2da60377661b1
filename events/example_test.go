package events_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// exampleServer starts an embedded NATS server with JetStream so the
// examples run on their own; in a program, connect to your NATS instead.
func exampleServer() (url string, stop func()) {
	n, stop, err := testenv.RunNATS()
	if err != nil {
		log.Fatal(err)
	}
	return n.URL(), stop
}

// A Client publishes configuration changes to the config stream; every
// replica folds that stream into the entries it fires. Each write returns
// the event type it published and the entry's new revision (the event's
// stream sequence).
func Example() {
	url, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	names := events.MustNames("") // the default prefix: CRONSTREAM_CONFIG, CRONSTREAM_ACTIVITY
	// Replicas create the streams at start; a client that may run first
	// creates them too.
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		log.Fatal(err)
	}
	c := events.NewClient(js, names, events.WithSource("cronstream/example"))

	res, err := c.Put(ctx, events.Entry{
		ID:      "daily-report",
		Cron:    "0 9 * * MON-FRI",
		Task:    events.Task{Type: "report:daily", Payload: []byte(`{"team":"ops"}`)},
		Options: events.Options{Queue: "reports"},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Type, res.Revision)

	res, err = c.Pause(ctx, "daily-report", "quarter close")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Type, res.Revision, res.Entry.Note)

	res, err = c.Resume(ctx, "daily-report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Type, res.Revision)

	res, err = c.Remove(ctx, "daily-report")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Type, res.Revision)

	_, _, err = c.Get(ctx, "daily-report")
	fmt.Println(errors.Is(err, events.ErrNotFound))
	// Output:
	// cronstream.entry.registered 1
	// cronstream.entry.paused 2 quarter close
	// cronstream.entry.resumed 3
	// cronstream.entry.removed 4
	// true
}

// Put keeps an entry's content when nothing changes: no event, the same
// revision. IfRevision makes a write conditional, so a change made
// meanwhile by someone else is a conflict rather than overwritten.
func ExampleClient_Put() {
	url, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	names := events.MustNames("")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		log.Fatal(err)
	}
	c := events.NewClient(js, names)

	e := events.Entry{ID: "cache-warm", Cron: "*/5 * * * *", Task: events.Task{Type: "cache:warm"}}
	first, err := c.Put(ctx, e)
	if err != nil {
		log.Fatal(err)
	}
	again, err := c.Put(ctx, e)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %d, then %q %d\n", first.Type, first.Revision, again.Type, again.Revision)

	e.Options.Queue = "critical"
	updated, err := c.Put(ctx, e, events.IfRevision(first.Revision))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(updated.Type, updated.Revision, updated.Entry.Options.QueueName())

	// A writer still holding revision 1 loses.
	e.Options.Queue = "low"
	_, err = c.Put(ctx, e, events.IfRevision(first.Revision))
	var conflict *events.ConflictError
	if errors.As(err, &conflict) {
		fmt.Printf("conflict: expected %d, found %d\n", conflict.Expected, conflict.Current)
	}
	// Output:
	// cronstream.entry.registered 1, then "" 1
	// cronstream.entry.updated 2 critical
	// conflict: expected 1, found 2
}

// History returns every config event of an entry, oldest first: who changed
// what, and the state after each change.
func ExampleClient_History() {
	url, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	names := events.MustNames("")
	if err := events.EnsureStreams(ctx, js, events.StreamConfig{Names: names}); err != nil {
		log.Fatal(err)
	}
	alice := events.NewClient(js, names, events.WithSource("cronstream/cli/alice"))
	bob := events.NewClient(js, names, events.WithSource("cronstream/cli/bob"))

	e := events.Entry{ID: "hello", Cron: "@every 10s", Task: events.Task{Type: "demo:hello"}}
	if _, err := alice.Put(ctx, e); err != nil {
		log.Fatal(err)
	}
	e.Cron = "@every 1m"
	if _, err := bob.Put(ctx, e); err != nil {
		log.Fatal(err)
	}
	if _, err := alice.Pause(ctx, "hello", "too chatty"); err != nil {
		log.Fatal(err)
	}

	history, err := alice.History(ctx, "hello")
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range history {
		fmt.Printf("%d %-27s %-20s cron %q paused %v\n", r.Seq, r.Event.Type, r.Event.Source, r.Entry.Cron, r.Entry.Paused)
	}
	// Output:
	// 1 cronstream.entry.registered cronstream/cli/alice cron "@every 10s" paused false
	// 2 cronstream.entry.updated    cronstream/cli/bob   cron "@every 1m" paused false
	// 3 cronstream.entry.paused     cronstream/cli/alice cron "@every 1m" paused true
}

// An entry on the last weekday of each month (a calendar form in the day of
// the month) whose tasks carry their entry and tick as asynq headers. Both
// make the entry gated: it is published under the .v2 types, which
// replicas of builds without them quarantine instead of misfiring.
func ExampleTaskHeaders() {
	e := events.Entry{
		ID:          "month-end-close",
		Cron:        "0 18 LW * *",
		Timezone:    "Europe/Berlin",
		Task:        events.Task{Type: "books:close", Headers: map[string]string{"team": "finance"}},
		TickHeaders: true,
	}
	if err := e.Validate(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("gated:", e.Gated())
	// The headers of its task of the tick at 18:00 CEST on July 31st, 2026
	// (a Friday), as a handler reads them with task.Headers().
	h := events.TaskHeaders(e, "2026-07-31T16:00:00Z", "", false)
	fmt.Println(h[events.HeaderEntry], h[events.HeaderScheduledAt], h["team"])

	e.Task.Headers = map[string]string{"cronstream-entry": "mine"}
	fmt.Println(e.Validate() != nil)
	// Output:
	// gated: true
	// month-end-close 2026-07-31T16:00:00Z finance
	// true
}
