package main

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/entrystate"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/shardview"
	"github.com/cronstream/cronstream/internal/stall"
)

// nextFireTime hides a next fire's time and how long until it, which
// depend on when the test runs.
var nextFireTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  \(in [^)]*\)`)

// TestPrintStatus holds status's text form byte for byte, every section
// filled and every section degraded: the live tests check what is in it,
// this that its layout stays.
func TestPrintStatus(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	backlog := int64(7)
	next := time.Now().Add(time.Hour)
	full := statusReport{
		Prefix: "cronstream",
		Replicas: []replica.Status{
			{Info: replica.Info{ID: "r1", Host: "h1", PID: 11, Started: at, Version: "v1.2.0", HTTP: ":8080", ConfigSeq: 9, FireCapacity: 12500}, BeatAge: "1.2s", State: replica.StateLive, Ready: "yes"},
			{Info: replica.Info{ID: "r2\x1b[31m", Host: "h2", PID: 22, Started: at, ConfigSeq: 12}, BeatAge: "31s", State: replica.StateUnresponsive, Ready: "unknown"},
		},
		Shards: shardview.Overview{Total: 8, Queues: 2, PerQueue: 4, UnownedCount: 3, Unowned: []string{"default/1", "nightly/2"}, OldestRenewal: 2.34, GlobalHolder: "r1",
			ByReplica: []shardview.ReplicaShards{
				{Replica: "r1", Owned: 5, Desired: 4, Queues: []string{"default"}, OldestRenewal: 2.34, HandoversIn: 1, HandoversOut: 2, Takeovers: 3, Live: true},
				{Replica: "gone", Owned: 0, Desired: 0, OldestRenewal: 0.05},
			}},
		Entries: entryCounts{Counts: entrystate.Counts{Active: 3, Paused: 2, Ended: 1, Completed: 2}, Quarantined: 1,
			Bad:           []quarantineView{{ID: "broken", Revision: 4, Time: at, Reason: "cron \"nope\": bad"}},
			FailurePaused: []quarantineView{{ID: "flaky", Revision: 6, Time: at, Reason: "paused on failure: task x archived"}},
			CompletedIDs:  []string{"five", "lost"}, CountUnknown: []string{"lost"}},
		Config:   streamPosition{Stream: "CRONSTREAM_CONFIG", LastSeq: 10, LastTime: &at, Messages: 10},
		Activity: streamPosition{Stream: "CRONSTREAM_ACTIVITY", LastSeq: 0},
		Outbox:   outboxStatus{Backlog: &backlog, ByQueue: map[string]int64{"default": 7}},
		Queues: []queueStatus{
			{Queue: "default", Pending: 1, Active: 2, Scheduled: 3, Retry: 4, Archived: 5, Processed: 60, Failed: 6, ProcessedToday: 10, FailedToday: 2, Outbox: 7, Held: 1, HeldDropped: 2},
			{Queue: "nightly", Paused: true},
		},
		NextFires: []nextFireView{{Entry: "soon", Queue: "default", Time: next}, {Entry: "later", Queue: "nightly", Time: next.Add(time.Hour)}},
		Late: []stall.Late{
			{Entry: "slow", Queue: "default", Tick: at, OverdueSeconds: 90, Reason: "redis: OOM", Replica: "r1"},
			{Entry: "quiet", Queue: "default", Tick: at, OverdueSeconds: 5},
		},
		LateAfter: "1m0s",
		Warnings:  []string{"persistence is off"},
		Notes:     []string{"a note"},
	}
	degraded := statusReport{
		Prefix:    "other",
		Replicas:  []replica.Status{},
		Config:    streamPosition{Stream: "OTHER_CONFIG", LastSeq: 3, Messages: 3},
		Activity:  streamPosition{Stream: "OTHER_ACTIVITY"},
		Shards:    shardview.Overview{Total: 4, Queues: 1, PerQueue: 4, Error: "NOPERM"},
		Outbox:    outboxStatus{Error: "connection refused"},
		QueuesErr: "connection refused",
		NextFires: []nextFireView{},
		Late:      []stall.Late{},
		LateAfter: "1m0s",
		Warnings:  []string{},
		Notes:     []string{"a note"},
		Errors:    []string{"redis: connection refused", "CRONSTREAM_ACTIVITY: stream not found"},
	}
	empty := degraded
	empty.Shards, empty.Outbox, empty.QueuesErr, empty.Errors = shardview.Overview{}, outboxStatus{Backlog: new(int64)}, "", nil
	empty.Queues = []queueStatus{}

	for _, tc := range []struct {
		name string
		rep  statusReport
		want string
	}{
		{"full", full, statusFullText},
		{"degraded", degraded, statusDegradedText},
		{"empty", empty, statusEmptyText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printStatus(&b, tc.rep)
			if got := nextFireTime.ReplaceAllString(b.String(), "TIME  (in …)"); got != tc.want {
				t.Errorf("status text changed:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

const statusFullText = `cronstream status (prefix cronstream)

Replicas: 1 live, 1 unresponsive
  ID          STATE         HOST  PID  VERSION  STARTED               LAST BEAT  CONFIG SEQ  LAG  FIRES/S SHOWN  HTTP   READY
  r1          live          h1    11   v1.2.0   2026-03-01T09:00:00Z  1.2s ago   9           1    12,500         :8080  yes
  r2\x1b[31m  unresponsive  h2    22   -        2026-03-01T09:00:00Z  31s ago    12          -    unknown        -      unknown

Shards: 8 (2 queues × 4), 3 without an owner, least recently renewed lease 2.3s ago
  REPLICA  OWNED  DESIRED  OLDEST LEASE  HANDOVERS IN/OUT  TAKEOVERS  LIVE  QUEUE DUTIES
  r1       5      4        2.3s          1/2               3          yes   default +global
  gone     0      0        100ms         0/0               0          no    —
  without an owner: default/1 nightly/2 and 1 more

Entries: 3 active, 2 paused, 1 ended, 2 completed, 1 quarantined
  quarantined broken at revision 4 (2026-03-01T09:00:00Z): cron "nope": bad
  paused flaky at revision 6 (2026-03-01T09:00:00Z): paused on failure: task x archived
  completed five: fired its max_fires, fires nothing more
  completed lost: its max_fires count is unknown: Redis lost it and the activity stream no longer holds every fire since the limit was set; put the entry with another --max-fires (it counts afresh) to fire again

Streams:
  CRONSTREAM_CONFIG        last seq 10 at 2026-03-01T09:00:00Z, 10 messages
  CRONSTREAM_ACTIVITY      last seq 0 at -, 0 messages

Outbox backlog (in Redis, not yet in CRONSTREAM_ACTIVITY): 7

Queues:
  QUEUE    PENDING  ACTIVE  SCHEDULED  RETRY  ARCHIVED  PROCESSED  FAILED  TODAY OK/FAILED  OUTBOX  PAUSED
  default  1        2       3          4      5         60         6       8/2              7       -
  nightly  0        0       0          0      0         0          0       0/0              0       yes
  default: 1 held tick(s) waiting (overlap buffer-one), 2 dropped unfired (skipped: overlap-dropped)

Next fires:
  TIME  (in …)  soon   queue default
  TIME  (in …)  later  queue nightly

Late (tick overdue for more than 1m0s): 2
  ENTRY  QUEUE    TICK                  OVERDUE  REASON
  slow   default  2026-03-01T09:00:00Z  1m30s    redis: OOM (r1)
  quiet  default  2026-03-01T09:00:00Z  5s       no failure reported by a replica

Warnings:
  ! persistence is off

Note:
  a note
`
const statusDegradedText = `cronstream status (prefix other)

Replicas: 0 live
  no live replica: no entry fires and no task is recovered until one runs (cronstream run)

Shards: 4 (1 queues × 4), leases unknown: NOPERM

Entries: 0 active, 0 paused, 0 ended, 0 completed, 0 quarantined

Streams:
  OTHER_CONFIG             last seq 3 at -, 3 messages
  OTHER_ACTIVITY           last seq 0 at -, 0 messages

Outbox backlog (in Redis, not yet in OTHER_ACTIVITY): unknown (see below)

Queues:
  unknown (see below)

Next fires:
  none

Late (tick overdue for more than 1m0s): 0

Note:
  a note

Could not read:
  redis: connection refused
  CRONSTREAM_ACTIVITY: stream not found
`
const statusEmptyText = `cronstream status (prefix other)

Replicas: 0 live
  no live replica: no entry fires and no task is recovered until one runs (cronstream run)

Entries: 0 active, 0 paused, 0 ended, 0 completed, 0 quarantined

Streams:
  OTHER_CONFIG             last seq 3 at -, 3 messages
  OTHER_ACTIVITY           last seq 0 at -, 0 messages

Outbox backlog (in Redis, not yet in OTHER_ACTIVITY): 0

Queues:
  none yet

Next fires:
  none

Late (tick overdue for more than 1m0s): 0

Note:
  a note
`
