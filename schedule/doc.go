// Package schedule is cronstream's schedule math: when an entry's ticks
// fall (Schedule, from its cron spec or @every interval, time zone,
// active window, exclusions and jitter), the asynq task id of a tick
// (TaskID, TaskEntry), the entry and tick an activity event id names
// (ParseActivityID), and what became of one attempt to fire a tick
// (Outcome, FireStatus).
//
// Every replica, the views (console, forecast, stall) and the command line
// compute the same answers from the same entry, so these are functions of
// their input only: the package imports neither NATS nor Redis, nor the
// firing engine (TestLayers).
package schedule
