// Package outbox holds the forms of outbox records, the events a fire or a
// recovery writes to Redis for the relay to publish. A fire writes its
// cronstream.entry.fired event into its queue's outbox in the same atomic
// step as the task (docs/invariants.md INV-outbox). Most records carry the
// event's JSON as the relay will publish it.
// A scheduled tick's fired event instead travels in a compact form that the
// relay expands into exactly the JSON AppendFiredEvent writes: a fourth of
// the bytes for Redis to take in, store and hand back on the busiest path
// (100,000 fires at one instant), and the JSON is built after the burst
// rather than during it.
//
// Version 1 of the form is
//
//	F1 <scheduled_at unix ns> <enqueued_at unix ns> <revision> <len entry> <len task id> <entry><task id><replica>
//
// with decimal numbers and the strings unescaped; the queue is the outbox's
// own and the source "cronstream/<replica>". The times are read back in UTC.
// A relay that meets a record in a form it does not know (a later version,
// "F2 ...") must leave it in place for a newer relay: the record is history
// and is never dropped.
//
// The fires of one bulk script call (plain ticks of many entries) share one
// multi-record (MultiRecordTag): their records framed one after another,
// each still published as its own message.
//
// A recovery's events travel in batch records (BatchRecordTag, then a JSON
// array of the events), published as one message each: readers of the
// recovery subjects split them with events.SplitEvents.
//
// It is engine-internal: the scheduler and the recoverer write these
// records and the relay reads them; readers of the streams only ever see
// the JSON events.
package outbox
