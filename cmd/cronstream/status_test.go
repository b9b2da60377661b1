package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

type statusJSON struct {
	Prefix   string `json:"prefix"`
	Replicas []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Ready string `json:"ready"`
	} `json:"replicas"`
	Entries struct {
		Active      int `json:"active"`
		Paused      int `json:"paused"`
		Quarantined int `json:"quarantined"`
		Bad         []struct {
			ID     string `json:"id"`
			Reason string `json:"reason"`
		} `json:"quarantined_entries"`
	} `json:"entries"`
	Config struct {
		LastSeq uint64 `json:"last_seq"`
	} `json:"config_stream"`
	Outbox struct {
		Backlog *int64 `json:"backlog"`
	} `json:"outbox"`
	Queues []struct {
		Queue   string `json:"queue"`
		Pending int64  `json:"pending"`
		Outbox  int64  `json:"outbox"`
	} `json:"queues"`
	NextFires []struct {
		Entry string    `json:"entry"`
		Time  time.Time `json:"time"`
	} `json:"next_fires"`
	Warnings []string `json:"warnings"`
	Notes    []string `json:"notes"`
	Errors   []string `json:"errors"`
}

func TestStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.ok("entry", "put", "soon", "--cron", "@every 1m", "--type", "t")
	e.ok("entry", "put", "later", "--cron", "@daily", "--type", "t", "--queue", "nightly")
	e.ok("entry", "put", "held", "--cron", "@hourly", "--type", "t")
	e.ok("entry", "pause", "held")
	// A config event this version cannot apply quarantines its entry.
	js := e.nats.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "cronstream.config.broken", []byte(`{"specversion":"1.0","id":"z","type":"cronstream.entry.registered","data":{"id":"broken","cron":"nope"}}`)); err != nil {
		t.Fatal(err)
	}
	e.ok("entry", "trigger", "soon", "--request-id", "r1")

	var st statusJSON
	e.okJSON(&st, "status", "--json")
	if st.Prefix != "cronstream" || st.Entries.Active != 2 || st.Entries.Paused != 1 || st.Entries.Quarantined != 1 {
		t.Errorf("entries: %+v", st.Entries)
	}
	if len(st.Entries.Bad) != 1 || st.Entries.Bad[0].ID != "broken" || st.Entries.Bad[0].Reason == "" {
		t.Errorf("quarantined: %+v", st.Entries.Bad)
	}
	if st.Config.LastSeq != 5 || len(st.Replicas) != 0 || len(st.Errors) != 0 {
		t.Errorf("config seq %d, replicas %v, errors %v", st.Config.LastSeq, st.Replicas, st.Errors)
	}
	if b := st.Outbox.Backlog; b == nil || *b != 1 {
		t.Errorf("outbox backlog %s, want 1 (the trigger's fired record, no relay running)", func() string {
			if b == nil {
				return "null"
			}
			return fmt.Sprint(*b)
		}())
	}
	if len(st.Queues) != 1 || st.Queues[0].Queue != "default" || st.Queues[0].Pending != 1 || st.Queues[0].Outbox != 1 {
		t.Errorf("queues: %+v", st.Queues)
	}
	if len(st.NextFires) != 2 || st.NextFires[0].Entry != "soon" || st.NextFires[1].Entry != "later" || !st.NextFires[0].Time.After(time.Now().Add(-time.Second)) {
		t.Errorf("next fires: %+v", st.NextFires)
	}
	// testenv's redis-server persists nothing: exactly what status warns of.
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "persistence is off") {
		t.Errorf("warnings: %v", st.Warnings)
	}
	if !strings.Contains(strings.Join(st.Notes, "\n"), "30s cutoff") || !strings.Contains(strings.Join(st.Notes, "\n"), "20s grace") {
		t.Errorf("notes: %v", st.Notes)
	}

	text := e.ok("status")
	for _, want := range []string{"Replicas: 0 live", "Entries: 2 active, 1 paused, 0 ended, 0 completed, 1 quarantined", "quarantined broken", "Outbox backlog", ": 1",
		"QUEUE", "default", "Next fires:", "soon", "persistence is off", "asynq servers run their own recoverer"} {
		if !strings.Contains(text, want) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}

	// A quarantined entry: ls shows it, get and a partial put explain,
	// put --replace repairs it.
	var all []entryJSON
	e.okJSON(&all, "entry", "ls", "--json")
	if len(all) != 4 || all[0].ID != "broken" || all[0].State != "quarantined" || all[0].Error == "" {
		t.Errorf("ls with a quarantined entry: %+v", all)
	}
	if msg := e.fail("entry", "put", "broken", "--cron", "@daily"); !strings.Contains(msg, "--replace") {
		t.Errorf("partial put on a quarantined entry: %s", msg)
	}
	e.ok("entry", "put", "broken", "--replace", "--cron", "@daily", "--type", "t")
	e.okJSON(&st, "status", "--json")
	if st.Entries.Quarantined != 0 || st.Entries.Active != 3 {
		t.Errorf("after the repair: %+v", st.Entries)
	}
}
