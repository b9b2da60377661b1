package configsync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// exampleClient starts an embedded NATS server with JetStream so the
// examples run on their own (in a program, connect to your NATS instead)
// and returns a config client on it.
func exampleClient() (c *events.Client, stop func()) {
	js, stop, err := testenv.RunJetStream()
	if err != nil {
		log.Fatal(err)
	}
	names := events.MustNames("")
	if err := events.EnsureStreams(context.Background(), js, events.StreamConfig{Names: names}); err != nil {
		stop()
		log.Fatal(err)
	}
	return events.NewClient(js, names, events.WithSource("cronstream/example")), stop
}

// printReport prints what a sync did, one line per action.
func printReport(r configsync.Report) {
	for _, o := range r.Outcomes {
		fmt.Printf("%s %s revision %d\n", o.Action.Kind.Sign(), o.Action.ID, o.Revision)
		if o.Action.Kind == configsync.Update {
			for _, ch := range o.Action.Changes {
				fmt.Println("   ", ch)
			}
		}
	}
	fmt.Printf("unchanged %v\n", r.Plan.Unchanged)
}

// A Syncer keeps the config stream equal to a schedules file: each sync
// publishes only the difference, and with Prune removes the entries it
// wrote that the file no longer lists. Run syncs every Interval;
// SyncOnce syncs once, as `cronstream sync -f` does.
func Example() {
	c, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "schedules")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "schedules.yaml")

	write := func(content string) {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			log.Fatal(err)
		}
	}
	write(`entries:
  - id: hello
    cron: "@every 10s"
    task: {type: demo:hello}
  - id: cache-warm
    cron: "*/5 * * * *"
    task: {type: cache:warm}
`)
	s := &configsync.Syncer{Provider: configsync.FileProvider{Path: file}, Client: c, Prune: true}
	r, err := s.SyncOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	printReport(r)

	// hello changes, cache-warm goes: one update, one removal.
	write(`entries:
  - id: hello
    cron: "@every 1m"
    task: {type: demo:hello}
`)
	if r, err = s.SyncOnce(ctx); err != nil {
		log.Fatal(err)
	}
	printReport(r)

	// Nothing to do the next time.
	if r, err = s.SyncOnce(ctx); err != nil {
		log.Fatal(err)
	}
	printReport(r)
	// Output:
	// + cache-warm revision 1
	// + hello revision 2
	// unchanged []
	// - cache-warm revision 3
	// ~ hello revision 4
	//     cron: '@every 10s' → '@every 1m'
	// unchanged []
	// unchanged [hello]
}

// MakePlan is a dry run: the difference between the stream's entries and
// a schedules file, field by field, before Apply publishes it.
func ExampleMakePlan() {
	c, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	if _, err := c.Put(ctx, events.Entry{ID: "report", Cron: "0 9 * * *", Task: events.Task{Type: "report:daily"}, Owner: configsync.DefaultOwner}); err != nil {
		log.Fatal(err)
	}

	cfgs, err := configsync.Parse([]byte(`entries:
  - id: report
    cron: "0 9 * * MON-FRI"
    timezone: Europe/Berlin
    task: {type: report:daily}
    options: {queue: reports}
`), "schedules.yaml")
	if err != nil {
		log.Fatal(err)
	}
	current, err := c.List(ctx)
	if err != nil {
		log.Fatal(err)
	}
	plan := configsync.MakePlan(current, cfgs, configsync.DefaultOwner, false)
	for _, a := range plan.Actions {
		fmt.Println(a.Kind.Sign(), a.ID, "from revision", a.Revision)
		for _, ch := range a.Changes {
			fmt.Println("   ", ch)
		}
	}

	outcomes, err := configsync.Apply(ctx, c, plan)
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range outcomes {
		fmt.Println(o.Action.ID, "now at revision", o.Revision)
	}
	// Output:
	// ~ report from revision 1
	//     cron: '0 9 * * *' → '0 9 * * MON-FRI'
	//     timezone: UTC → Europe/Berlin
	//     options.queue: default → reports
	// report now at revision 2
}

// Parse reports every problem of a schedules file at once, each with its
// entry, field and line; nothing of an invalid file is synced.
func ExampleParse() {
	_, err := configsync.Parse([]byte(`entries:
  - id: hello
    cron: "every ten seconds"
    task: {type: demo:hello}
  - id: report
    cron: "0 9 * * *"
    task: {type: report:daily}
    options: {timeout: 30}
`), "schedules.yaml")
	var invalid *configsync.InvalidError
	if errors.As(err, &invalid) {
		for _, p := range invalid.Problems {
			fmt.Println(p)
		}
	}
	// Output:
	// entry hello: cron (line 3): "every ten seconds": expected 5 to 6 fields, found 3: [every ten seconds]
	// entry report: options.timeout (line 8): "30" has no unit: write a duration such as 30s, 10m or 1h
}

// Export writes entries as a schedules file; syncing it back changes
// nothing.
func ExampleExport() {
	maxRetry := 3
	entries := []events.Entry{{
		ID:      "cache-warm",
		Cron:    "*/5 * * * *",
		Task:    events.Task{Type: "cache:warm", Payload: []byte(`{"tier":"hot"}`)},
		Options: events.Options{Queue: "critical", MaxRetry: &maxRetry},
		Overlap: events.OverlapSkip,
		Owner:   "sync",
	}}
	if err := configsync.Export(os.Stdout, entries); err != nil {
		log.Fatal(err)
	}
	// Output:
	// entries:
	//   - id: cache-warm
	//     cron: '*/5 * * * *'
	//     timezone: UTC
	//     task:
	//       type: cache:warm
	//       payload_json: '{"tier":"hot"}'
	//     options:
	//       queue: critical
	//       max_retry: 3
	//       timeout: 30m
	//     catchup:
	//       policy: none
	//     overlap: skip
	//     paused: false
	//     owner: sync
}
