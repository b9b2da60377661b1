package asynqcompat_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/hibiken/asynq"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/asynqcompat"
	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// exampleJetStream starts an embedded NATS server with JetStream so the
// examples run on their own; in a program, connect to your NATS instead.
func exampleJetStream() (js jetstream.JetStream, stop func()) {
	js, stop, err := testenv.RunJetStream()
	if err != nil {
		log.Fatal(err)
	}
	return js, stop
}

// A program that registered its periodic tasks with asynq's Scheduler
// registers them with cronstream by changing the constructor. Register
// publishes the entry (the cronstream replicas fire it into Redis); the id
// is derived from the registration, so the same registration after a
// restart is the same entry, and publishes nothing.
func ExampleScheduler() {
	js, stop := exampleJetStream()
	defer stop()

	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		log.Fatal(err)
	}
	scheduler, err := asynqcompat.NewScheduler(js, &asynqcompat.SchedulerOpts{Location: berlin})
	if err != nil {
		log.Fatal(err)
	}
	task := asynq.NewTask("report:daily", []byte(`{"team":"ops"}`))
	id, err := scheduler.Register("0 9 * * MON-FRI", task, asynq.Queue("reports"), asynq.MaxRetry(5))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(id)

	// The same registration again (a restart): the same id.
	again, err := scheduler.Register("0 9 * * MON-FRI", task, asynq.Queue("reports"), asynq.MaxRetry(5))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again == id)

	// What a periodic entry cannot carry is refused, naming the option.
	_, err = scheduler.Register("@hourly", task, asynq.ProcessIn(time.Minute))
	fmt.Println(err)

	if err := scheduler.Unregister(id); err != nil {
		log.Fatal(err)
	}
	// Output:
	// report-daily-10a7e89529288d9f
	// true
	// asynqcompat: register "@hourly" "report:daily": asynq option ProcessIn(1m0s): cronstream enqueues each tick when it is due; move the schedule instead (the cron spec, or jitter for a spread)
}

// configs is an asynq.PeriodicTaskConfigProvider: in a program, a file, a
// database or an API.
type configs []*asynq.PeriodicTaskConfig

func (c configs) GetConfigs() ([]*asynq.PeriodicTaskConfig, error) { return c, nil }

// A PeriodicTaskManager keeps its owner's entries equal to what the
// provider returns: at Start and on every poll it publishes the difference
// and removes its entries the provider no longer lists. Shutdown removes
// nothing: the replicas keep firing the entries.
func ExamplePeriodicTaskManager() {
	js, stop := exampleJetStream()
	defer stop()

	mgr, err := asynqcompat.NewPeriodicTaskManager(asynqcompat.PeriodicTaskManagerOpts{
		PeriodicTaskConfigProvider: configs{
			{Cronspec: "*/5 * * * *", Task: asynq.NewTask("cache:warm", nil), Opts: []asynq.Option{asynq.Queue("critical")}},
			{Cronspec: "@every 1h", Task: asynq.NewTask("cleanup", nil)},
		},
		JetStream:     js,
		SchedulerOpts: &asynqcompat.SchedulerOpts{Owner: "billing-jobs"},
		SyncInterval:  time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := mgr.Start(); err != nil {
		log.Fatal(err)
	}
	mgr.Shutdown()

	entries, err := events.NewClient(js, events.MustNames("")).List(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		fmt.Println(e.ID, e.Entry.Cron, e.Entry.Options.Queue, e.Entry.Owner)
	}
	// Output:
	// cache-warm-3057cfe1f5840839 */5 * * * * critical billing-jobs
	// cleanup-c16a4f6b1e7d876e @every 1h default billing-jobs
}
