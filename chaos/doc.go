// Package chaos is cronstream's chaos suite: real
// `cronstream run` replica processes, real asynq worker processes, a real
// redis-server and an embedded 3-node NATS cluster, faulted at random from a
// printed seed. It also holds the network-cut test: one replica cut off from
// NATS through a TCP proxy the test controls.
//
// # Faults
//
// Single faults fall at random through the whole chaos phase: a replica
// killed with SIGKILL, a NATS node stopped, a worker killed mid-task. On
// top, every round of the schedule (the short form has one, long forms one
// per two minutes) holds one of each whole-system fault, in an order the
// seed picks:
//
//   - every replica killed at once;
//   - Redis killed with SIGKILL and started again, its AOF (appendfsync
//     always) loaded: nothing acknowledged is lost;
//   - Redis data loss: AOF is turned off, Redis is stopped and its files
//     removed, and it starts again empty, as a server without persistence
//     does. The replicas keep running through it. The relay publishes each
//     fire at once, so the loss rarely takes a record with it;
//     CRONSTREAM_CHAOS_LOSS_AFTER_FIRES=1 times it just after a second's
//     fires instead, so that dozens go with it (see below);
//   - a full NATS restart: every node stopped, then all started again on
//     their stores.
//
// And in every round, a split view: one replica's view of the others is
// frozen (--test-freeze-view, a file the test creates and removes) for
// 12-18 s, longer than the membership TTL, while another replica is
// killed and started again inside it (unless that falls in a quiet window
// below). The frozen replica still counts the killed one among the live
// and never sees it come back; the others drop it and take it in again,
// so the replicas disagree on who should own what, and only the shard
// leases (one holder each) keep each tick fired once.
//
// And for the whole run one replica, picked by the seed, runs with its local
// clock 20 minutes fast or slow (--test-clock-offset); it must correct it
// against Redis TIME and neither fire early nor hold the others back.
//
// Single replica kills stay clear of the data loss (15 s before to 10 s
// after): a replica that starts while Redis is empty has no position of its
// own, and the fires its relay had not published are known only to the
// replica that made them, which is the documented limit of the restore
// (docs/operations.md, Redis). NATS node stops stay clear of the full NATS
// restart, since one node cannot rejoin a cluster whose others are down.
// The data loss and the full NATS outage are kept apart too. A data loss
// during a whole-NATS outage is a fault of its own, tested in scheduler
// TestRedisLostWhileNATSDown: the replicas restore from their own
// positions and keep firing, and the whole outbox backlog goes with Redis.
//
// Records lost with Redis are where the restore needs the running
// replicas' positions, which CRONSTREAM_CHAOS_LOSS_AFTER_FIRES=1 shows:
// the replica that made such a fire holds it as its position, and another
// replica may act on the entry first once Redis is back (every tick is
// late after the downtime). That one only proposes its older position;
// the replica that made the fire raises the proposal before it settles
// (docs/invariants.md INV-restore), so the tick does not fire again. The check
// counts any such tick as a duplicate.
//
// # Outage bands
//
// Ticks may be missed only inside an outage band, an outage widened by
// 3 s after it and before it by 5 s when no replica is up (ready and not
// killed), 3 s when Redis is down (killed, or stopped for the data loss
// until it answers again). The 5 s is ownership's takeover bound (a dead
// owner's lease lapses, a poll, a rank's step: 4 s) and a second for the
// tick in flight: a tick whose owner died before it may still be waiting
// for its takeover when the last replica goes. A replica killed within
// those 5 s of another replica's kill opens a band from a second before
// the first kill to a second after its own: it may have taken the first
// one's shards and died before firing their owed ticks, and its fresh
// leases hold them another term (two failures in one catch-up grace,
// which the time budget does not cover). A full NATS restart
// opens no band: the replicas keep firing into Redis, and the events wait in
// the outboxes. A tick missed inside a band must still be accounted for by a
// skipped event.
//
// # Checks across a Redis data loss
//
// Without a data loss, Redis at the end holds every task, and each check
// compares it with the activity stream and the workers' logs. A data loss
// takes every task, watermark and outbox record created before it, so the
// final Redis holds only what was created after the server came back. The
// data-loss fault therefore pauses every write (CLIENT PAUSE WRITE) just
// before the stop and reads every outbox: those records, less the ones the
// relay still published, are the only events that can be lost with Redis.
// Each check then reads:
//
//   - A tick is handled when it has a task in Redis, a fired event in the
//     stream, or a fired record lost with Redis. Expected ticks run from an
//     entry's first handled tick to the end; each must be handled, or be
//     covered by a skipped event (or a skipped record lost with Redis)
//     inside an outage band.
//   - A fired event without a task is fine when the event was stored before
//     Redis came back empty, or its record was in an outbox at the loss: its
//     task went with the data. Any other is lost (counted in lost events).
//   - Duplicates stay strict. A task in the final Redis was created after the
//     last loss, so a task whose fired event was stored before Redis came
//     back is a tick fired again after the loss (the stream drops the second
//     publish as a duplicate, so only this comparison shows it). A task for
//     the tick of a record lost with Redis is a second fire too, and so is
//     an event under that record's id with another enqueue time (a fired
//     event's id names its tick, so a second fire publishes under the lost
//     record's id; a record the relay had in flight keeps its time). A
//     tick both skipped and fired counts whether the fire left a task or
//     only its event, and a task started twice in one attempt counts across
//     the loss.
//   - Lost with Redis is reported on its own and does not fail the run:
//     fired records (their tasks were enqueued, and may have run), skipped
//     records (their ticks count as skipped) and recovery records not yet
//     relayed when the data went.
//   - Executions of tasks not in the final Redis are fine when their tick
//     has a fired event or a lost fired record (the task went with the data);
//     tasks a killed worker held are fine when gone with a later loss.
//
// Every fired event must also have been stored no earlier than its tick
// (1 s tolerance): the replica with the offset clock may not fire early.
//
// It owns only tests and their fixture worker (testdata/worker); it never
// changes production code and nothing imports it. Run it with `make chaos`
// (short form) or `make chaos DURATION=10m` (long form).
package chaos
