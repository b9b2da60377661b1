// Package events is cronstream's public Go API for its events: the event
// contract that publishers, audit readers and every replica agree on, and
// the write side of the configuration stream, under the names programs
// have always used.
//
// # The facade rule
//
// events declares nothing itself. It re-exports every exported name of
// package contract (the event contract, with no NATS or Redis dependency)
// and of package streamclient (the NATS client). Types are aliases, so
// events.Entry and contract.Entry are one type with the same methods;
// constants are the same constants; functions and sentinel errors are
// variables holding the same values, so errors.Is(err, events.ErrNotFound)
// matches whichever name made the error. TestFacadeIsComplete fails when a
// name of either package is missing here, so a program that imports events
// keeps working unchanged. A program that wants the contract without a
// NATS dependency imports contract. Inside cronstream, the packages below
// this facade in the layers (schedule, the outbox forms, the Redis layer
// taskstate) import contract directly, so they depend on no NATS package;
// TestLayers keeps it so.
//
// # Streams and subjects
//
// With a prefix p (Names; default "cronstream", 1 to 64 of [A-Za-z0-9_-])
// and P its upper-case form with "-" as "_":
//
//   - P_CONFIG, the config stream, kept forever (no age limit, no delete,
//     no purge), with subjects p.config.<entry> (config events) and
//     p.failpause.<entry> (fail-pause requests replicas publish).
//   - P_ACTIVITY, the activity stream, kept for ActivityMaxAge (default 30
//     days) with a duplicate window (default one hour), with subjects
//     p.fire.<entry> (fired, skipped, cancelled and lost events) and
//     p.recovery.<queue token> (recovery events; EncodeQueueToken turns
//     any queue name into one token, reversibly).
//   - P_REPLICAS, the key-value bucket of replica heartbeats.
//
// An entry id is 1 to 128 of [A-Za-z0-9_-], so it is always one subject
// token. Names builds every name and filter.
//
// # Events
//
// Every event is a CloudEvents 1.0 event in structured JSON (Event). Its
// source is "cronstream/<replica>" for a replica, "cronstream/client" for
// this client by default and "cronstream/cli/<user>" for the command line;
// its subject is the entry id (config and fire subjects) or the queue
// (recovery subjects). Types lists every type with what it records:
//
//   - Config events (p.config.<entry>): cronstream.entry.registered,
//     .updated, .paused, .resumed and .removed. The data of each is the
//     entry's full state after the change (Entry), so the last message on
//     a subject is the entry's current state. An entry that sets a field
//     earlier builds would ignore (Entry.Gated) is published under the
//     gated form of the type, the plain type with ".v2" (GatedType), which
//     earlier builds refuse rather than misread; ConfigKind gives the
//     plain kind of either form. Removals are never gated.
//   - Fail-pause requests (p.failpause.<entry>): a gated paused event a
//     replica publishes to pause an entry with pause_on_failure, applied
//     only when it holds (DecodeFailPause, FailPauseRequest.Check) and
//     otherwise refused without changing or quarantining the entry.
//   - Activity events (p.fire.<entry>): cronstream.entry.fired (Fired),
//     cronstream.entry.skipped (Skipped, with its reason and, for a run of
//     ticks, until and count), cronstream.task.cancelled (TaskCancelled)
//     and cronstream.task.lost (TasksLost).
//   - Recovery events (p.recovery.<queue token>): cronstream.task.retried
//     and cronstream.task.archived (TaskRecovered), and
//     cronstream.aggregation.reclaimed (AggregationReclaimed). A message
//     on a recovery subject may hold a batch, a JSON array of complete
//     events; SplitEvents gives one event at a time whichever form a
//     message has.
//
// Readers ignore fields they do not know and never fail on an unknown
// type: a reader of the activity stream shows it as it is, and the
// projector quarantines the entry of a config event it cannot apply.
// Validate judges an entry the same way for every publisher, and
// DecodeConfigEvent refuses text encoding/json would repair, so a raw
// publish gets the same verdict as the command line.
//
// # Ids and headers
//
// Config events get 128 random bits. Activity event ids are derived from
// the fact they record (FiredEventID, LostEventID, BatchID and the other
// constructors; ParseEventID reads them back): fire:<entry>:<unix tick>,
// skip:<entry>:<unix tick> or skip:<entry>:<first>-<last>, and so on, so a
// republished event is dropped by the stream's duplicate window. The asynq
// task id of a tick is <p>:<entry>:<tick in RFC 3339 UTC> (TaskID), a
// trigger's <p>:<entry>:trigger:<request id>.
//
// NATS headers of the contract:
//
//   - Nats-Msg-Id is the event id on every publish (a batch: its BatchID).
//   - Nats-Expected-Last-Subject-Sequence with
//     Nats-Expected-Last-Subject-Sequence-Subject p.*.<entry> on every
//     config write: the revision the writer read, over both of the entry's
//     subjects (optimistic concurrency; a conflict is ErrRevisionConflict).
//   - Cronstream-Redis-Unconfirmed (HeaderRedisUnconfirmed) on an activity
//     message published before Redis's replicas confirmed its write:
//     "<acked>/<wanted> <reason>". It is not part of the event.
//
// asynq task headers, on the tasks of an entry with tick_headers
// (TaskHeaders): cronstream-entry, cronstream-scheduled-at, and
// cronstream-trigger or cronstream-backfill on a trigger's or a
// backfill's task.
//
// docs/design.md ("Event contract") is the full reference, field by field.
package events
