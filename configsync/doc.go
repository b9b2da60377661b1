// Package configsync is configuration as code for cronstream: the schedules
// file format, the plan that turns a wanted set of entries into config
// events, and a syncer that keeps the config stream equal to what a
// ConfigProvider returns (the successor of asynq's PeriodicTaskConfigProvider
// and PeriodicTaskManager).
//
// It owns three rules that make syncing safe to run again and again:
//
//   - Whole or nothing: every wanted entry is validated before anything is
//     published. One invalid entry (or a provider error) skips the whole sync
//     and keeps the current configuration, as asynq's manager does.
//   - Ownership: every entry a sync writes carries the sync's owner label
//     (unless its Config names one, as an export does), and pruning removes
//     only entries carrying the sync's label. Entries made by hand
//     (`cronstream entry put`, no owner) are never pruned.
//   - Pause state is operational: a sync never pauses or resumes an entry
//     unless its source says `paused` explicitly, so an entry paused by an
//     operator stays paused across syncs.
//
// Export writes entries as a schedules file that Parse reads back into the
// same entries, payload bytes included, so an export synced back is a no-op.
//
// Only differences are published: an entry whose content is unchanged costs
// no event. Every write is conditional on the revision the plan was made
// from, so a change made meanwhile by someone else is reported as a
// conflict, never overwritten.
//
// It never talks to Redis and never fires anything: it only writes config
// events through events.Client.
package configsync
