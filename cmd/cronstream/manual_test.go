package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

type manualBackfillJSON struct {
	Ticks              int       `json:"ticks"`
	Fired              []string  `json:"fired"`
	Already            int       `json:"already"`
	Registered         time.Time `json:"registered"`
	BeforeRegistration int       `json:"before_registration"`
}

// entryTasks counts queue's pending tasks of entry's scheduled ticks.
func entryTasks(t *testing.T, e *cliEnv, queue, entry string) int {
	t.Helper()
	n := 0
	for _, task := range pendingTasks(t, inspector(t, e.redis.URL), queue) {
		if strings.HasPrefix(task.ID, events.DefaultPrefix+":"+entry+":") && !strings.Contains(task.ID, ":trigger:") {
			n++
		}
	}
	return n
}

// TestManualFiresBesideOtherEntries: with a replica firing two entries of
// one queue, the revision fence holds the stream's sequence, which is above
// either entry's own revision; trigger and backfill still fire, and the
// backfill's counts are true.
func TestManualFiresBesideOtherEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "manual-1")
	e.ok("entry", "put", "t1", "--cron", "@every 2s", "--type", "x", "--queue", "q1")
	e.ok("entry", "put", "t2", "--cron", "@every 2s", "--type", "y", "--queue", "q1")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return entryTasks(t, e, "q1", "t1") >= 2 && entryTasks(t, e, "q1", "t2") >= 2
	}, "the replica did not fire both entries:\n%s", p.Stderr())

	var tr triggerJSON
	e.okJSON(&tr, "entry", "trigger", "t1", "--json")
	if !tr.Created || tr.Queue != "q1" {
		t.Fatalf("trigger: %+v", tr)
	}

	var bf manualBackfillJSON
	e.okJSON(&bf, "entry", "backfill", "t1", "--from", "-60s", "--to", "now", "--json", "--before-registration")
	// t1 is seconds old: at most the ticks since its registration (and one
	// more the replica may fire meanwhile) had fired before.
	sinceReg := int(time.Since(bf.Registered)/(2*time.Second)) + 2
	if bf.Ticks < 29 || len(bf.Fired)+bf.Already != bf.Ticks || bf.Already > sinceReg {
		t.Fatalf("backfill of a %s old entry over 60 s: %+v", time.Since(bf.Registered).Round(time.Second), bf)
	}
	if bf.BeforeRegistration < bf.Ticks-sinceReg || len(bf.Fired) < bf.BeforeRegistration {
		t.Errorf("ticks before the registration not reported as fired: %+v", bf)
	}
	// Every tick of the window is a task now, once.
	if n := entryTasks(t, e, "q1", "t1"); n < bf.Ticks {
		t.Errorf("%d tasks of t1 after backfilling %d ticks", n, bf.Ticks)
	}
	text := e.ok("entry", "backfill", "t1", "--from", "-60s", "--to", "-30s", "--before-registration")
	if !strings.Contains(text, "0 fired now") || !strings.Contains(text, "before entry t1 was registered") {
		t.Errorf("repeated backfill: %s", text)
	}
}

// TestManualFireRefusedExitsNonZero: a manual fire the script refuses is an
// error with its reason, never a success nor a tick "fired already".
func TestManualFireRefusedExitsNonZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "r1", "--cron", "@every 2s", "--type", "x", "--queue", "rq")
	// A fence above any sequence of this stream: as if a replica had fired
	// from a configuration this command cannot read.
	rc := e.redis.Client(t)
	if err := rc.Set(context.Background(), taskstate.Own(events.DefaultPrefix, "rq").Fence(), 1_000_000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	msg := e.fail("entry", "trigger", "r1")
	if !strings.Contains(msg, "revision-fenced") {
		t.Errorf("refused trigger: %s", msg)
	}
	r := e.run("entry", "backfill", "r1", "--from", "-20s", "--to", "-1s", "--before-registration")
	if r.code == 0 || !strings.Contains(r.stderr, "revision-fenced") || strings.Contains(r.stdout, "had fired already") && !strings.Contains(r.stdout, " 0 had fired already") {
		t.Errorf("refused backfill:\n%s", r)
	}
	if n := entryTasks(t, e, "rq", "r1"); n != 0 {
		t.Errorf("%d tasks after refused fires", n)
	}
}

// TestManualFiresWhileEntriesChange: triggers and backfills succeed, with
// true counts, while other entries of the same queue and of other queues
// change (payloads, and a queue move back and forth) and a replica fires
// them all, and while the triggered entry itself changes.
func TestManualFiresWhileEntriesChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	p := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--replica-id", "manual-2")
	client := events.NewClient(e.nats.JetStream(t), events.MustNames(events.DefaultPrefix))
	entry := func(id, queue string, payload int) events.Entry {
		return events.Entry{ID: id, Cron: "@every 2s", Task: events.Task{Type: "t:" + id, Payload: []byte(strconv.Itoa(payload))}, Options: events.Options{Queue: queue}}
	}
	c := context.Background()
	for _, en := range []events.Entry{entry("a", "q1", 0), entry("b", "q1", 0), entry("c", "q2", 0), entry("d", "q2", 0)} {
		e.ok("entry", "put", en.ID, "--cron", en.Cron, "--type", en.Task.Type, "--queue", en.Options.Queue, "--payload", "0")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return entryTasks(t, e, "q1", "a") >= 2 && entryTasks(t, e, "q1", "b") >= 1
	}, "the replica did not fire:\n%s", p.Stderr())

	// Change b (same queue), c (other queue) and move d between queues
	// until the manual fires are done.
	stop := make(chan struct{})
	changed := make(chan error, 1)
	var rounds atomic.Int64
	go func() {
		var err error
		defer func() { changed <- err }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			n := int(rounds.Add(1))
			dq := "q2"
			if n%2 == 1 {
				dq = "q3"
			}
			for _, en := range []events.Entry{entry("b", "q1", n), entry("c", "q2", n), entry("d", dq, n)} {
				if _, err = client.Put(c, en); err != nil {
					return
				}
			}
		}
	}()
	// The manual fires start once the changes have, and the changes go on
	// until three rounds were made, however fast the fires are done.
	testenv.Eventually(t, 10*time.Second, func() bool { return rounds.Load() >= 1 }, "the first round of changes")
	// d moves every round: a trigger whose every fresh read was overtaken
	// by a move is refused, as it should be (three reads, then an error
	// naming the move). The user's answer is to run it again with the
	// same request id; on a loaded machine one read can take longer than
	// a round, so the test does the same, a few times.
	movedRetries := 0
	for i := range 4 {
		for _, id := range []string{"a", "b", "d"} {
			args := []string{"entry", "trigger", id, "--request-id", fmt.Sprintf("req-%s-%d", id, i), "--json"}
			r := e.run(args...)
			for id == "d" && r.code != 0 && strings.Contains(r.stderr, "refused (moved") && movedRetries < 10 {
				movedRetries++
				r = e.run(args...)
			}
			if r.code != 0 {
				t.Fatalf("command failed:\n%s", r)
			}
			var tr triggerJSON
			if err := json.Unmarshal([]byte(r.stdout), &tr); err != nil {
				t.Fatalf("trigger %s #%d: %v:\n%s", id, i, err, r.stdout)
			}
			if !tr.Created {
				t.Errorf("trigger %s #%d: %+v", id, i, tr)
			}
		}
	}
	if movedRetries > 0 {
		t.Logf("triggers of d run again after a refusal for a move: %d", movedRetries)
	}
	var bfA, bfB manualBackfillJSON
	e.okJSON(&bfA, "entry", "backfill", "a", "--from", "-40s", "--to", "now", "--before-registration", "--json")
	e.okJSON(&bfB, "entry", "backfill", "b", "--from", "-40s", "--to", "now", "--before-registration", "--json")
	// (A change that failed ended the rounds: its error is read below.)
	testenv.Eventually(t, 10*time.Second, func() bool { return rounds.Load() >= 3 || len(changed) > 0 }, "three rounds of changes")
	close(stop)
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	for _, bf := range []manualBackfillJSON{bfA, bfB} {
		if bf.Ticks < 19 || len(bf.Fired)+bf.Already != bf.Ticks {
			t.Errorf("backfill counts: %+v", bf)
		}
	}
	// Every tick of a's window is one task in q1 now, and every trigger is
	// a task of its own.
	if n := entryTasks(t, e, "q1", "a"); n < bfA.Ticks {
		t.Errorf("%d tasks of a after backfilling %d ticks", n, bfA.Ticks)
	}
	triggers := 0
	for _, q := range []string{"q1", "q2", "q3"} {
		for _, task := range pendingTasks(t, inspector(t, e.redis.URL), q) {
			if strings.Contains(task.ID, ":trigger:req-") {
				triggers++
			}
		}
	}
	if triggers != 12 {
		t.Errorf("%d triggered tasks, want 12", triggers)
	}
}
