// Package asynqcompat is cronstream's asynq-shaped Go API: a Scheduler with
// asynq's Register(cronspec, task, opts...) and Unregister(entryID), and a
// PeriodicTaskManager that takes an asynq.PeriodicTaskConfigProvider, so a
// program written against asynq's scheduler moves to cronstream by
// changing its constructor. Instead of running timers they publish config
// events (through events.Client and configsync's plan); the cronstream
// replicas fire every entry exactly once per tick into the same Redis, as
// ordinary asynq tasks that the program's asynq workers process unchanged.
//
// What changes for the program (docs/migrating-from-asynq.md has the whole
// list and the cutover):
//
//   - Entries are stored. They fire from the moment they are registered,
//     keep firing while the program is down, and are removed by Unregister
//     (or, for the manager, when the provider stops returning them), never
//     by Shutdown.
//   - Entry ids are stable: derived from the registration (or given with
//     EntryID), the same in every process and after every restart, so an
//     entry keeps one history. `cronstream import asynq` derives the same
//     ids from a running asynq deployment.
//   - Every asynq v0.26.0 option converts, or is refused with an error
//     naming it: TaskID, ProcessAt and ProcessIn (each tick gets its own
//     task id and is enqueued when due) and an absolute Deadline (use this
//     package's Deadline, relative to the tick). Options given to
//     asynq.NewTask count, as in asynq.
//   - SchedulerOpts.Location becomes each entry's time zone; the hooks of
//     asynq.SchedulerOpts have no counterpart, since this process enqueues
//     nothing (package audit reads what fired).
//   - @every counts from the Unix epoch, not from registration.
//
// Package events, configsync and the other core packages do not import
// asynq; this one does, so only programs that use it depend on asynq.
package asynqcompat
