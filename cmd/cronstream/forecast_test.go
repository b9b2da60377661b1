package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestForecastCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	for i := range 4 {
		e.ok("entry", "put", fmt.Sprintf("nightly-%d", i), "--cron", "0 0 * * *", "--type", "report", "--queue", "reports")
	}
	e.ok("entry", "put", "hourly", "--cron", "@every 1h", "--type", "t")
	e.ok("entry", "put", "fast", "--cron", "@every 10s", "--type", "t", "--queue", "fast")
	e.ok("entry", "put", "held", "--cron", "* * * * *", "--type", "t")
	e.ok("entry", "pause", "held")

	var f struct {
		From    time.Time `json:"from"`
		Minutes int       `json:"minutes"`
		Entries int       `json:"entries"`
		Total   int64     `json:"total"`
		Groups  []struct {
			Name  string `json:"name"`
			Total int64  `json:"total"`
		} `json:"groups"`
	}
	e.okJSON(&f, "forecast", "--window", "1h", "--json")
	if f.Minutes != 60 || f.Entries != 6 {
		t.Fatalf("minutes %d entries %d, want 60 and 6 (paused left out)", f.Minutes, f.Entries)
	}
	if f.Groups[0].Name != "fast" || f.Groups[0].Total != 360 {
		t.Fatalf("groups %+v: want fast with 360 fires first", f.Groups)
	}

	out := e.ok("forecast", "--window", "24h", "--by", "queue")
	for _, want := range []string{"4 entries fire at 00:00:00 UTC (0 0 * * *)", "hint: 4 entries of \"0 0 * * *\"", "reports", "fast"} {
		if !strings.Contains(out, want) {
			t.Fatalf("forecast output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "held") {
		t.Fatalf("paused entry in the forecast:\n%s", out)
	}
	if msg := e.fail("forecast", "--by", "owner"); !strings.Contains(msg, "want queue or entry") {
		t.Fatalf("bad --by: %s", msg)
	}
	if msg := e.fail("forecast", "--window", "30d"); !strings.Contains(msg, "--window") {
		t.Fatalf("bad --window: %s", msg)
	}
}
