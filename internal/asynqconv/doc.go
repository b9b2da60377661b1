// Package asynqconv turns asynq periodic registrations into cronstream
// entries. It is the one conversion both the asynq-shaped Go API
// (package asynqcompat) and `cronstream import asynq` use: a registration
// is what asynq's Scheduler.Register receives and what its SchedulerEntry
// keeps in Redis (spec, task type, payload, the options' String() forms),
// so the two ways into cronstream agree on every option and on every
// entry id.
//
// It imports no asynq package: options are read from their String()
// forms, which asynq v0.26.0 writes for every option it has and which
// round-trip exactly for the options cronstream carries.
package asynqconv
