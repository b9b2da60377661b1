package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// TestMaxOutboxFlags: --max-outbox-bytes takes sizes with units; the
// deprecated --max-outbox is a record count converted to bytes, refused
// beside --max-outbox-bytes; bad sizes are refused by name.
func TestMaxOutboxFlags(t *testing.T) {
	t.Parallel()
	e := &cliEnv{t: t, vars: baseEnv()}
	for _, c := range []struct {
		args []string
		want int64
		err  string
	}{
		{args: nil, want: replica.DefaultMaxOutboxBytes},
		{args: []string{"--max-outbox-bytes", "64MiB"}, want: 64 << 20},
		{args: []string{"--max-outbox-bytes", "2gib"}, want: 2 << 30},
		{args: []string{"--max-outbox-bytes", "1500KB"}, want: 1_500_000},
		{args: []string{"--max-outbox-bytes", "4096"}, want: 4096},
		{args: []string{"--max-outbox", "100000"}, want: 100_000 * taskstate.OutboxRecordBytes},
		{args: []string{"--max-outbox", "10", "--max-outbox-bytes", "1MiB"}, err: "give --max-outbox-bytes only"},
		{args: []string{"--max-outbox", "-1"}, err: "must be positive"},
		{args: []string{"--max-outbox-bytes", "0"}, err: "is not a size"},
		{args: []string{"--max-outbox-bytes", "12XB"}, err: "is not a size"},
		{args: []string{"--max-outbox-bytes", "9999999TiB"}, err: "too large"},
	} {
		f := &replicaFlags{}
		cmd := &cobra.Command{Use: "run"}
		f.add(cmd, "")
		cmd.Flags().SetOutput(io.Discard) // the deprecation notice
		err := cmd.ParseFlags(c.args)
		var got int64
		if err == nil {
			got, err = f.outboxBound()
		}
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%v: error %v, want one with %q", c.args, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%v: %d, %v; want %d", c.args, got, err, c.want)
		}
	}
	// The deprecated flag says so.
	if msg := e.fail("run", "--max-outbox", "10", "--max-outbox-bytes", "1MiB"); !strings.Contains(msg, "--max-outbox has been deprecated") {
		t.Errorf("no deprecation notice: %s", msg)
	}
}

// TestRedisWaitFlags: --redis-wait-replicas is auto (the default), 0 or a
// count; --redis-wait-timeout is positive and at most 5s.
func TestRedisWaitFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want int
		err  string
	}{
		{args: nil, want: relay.WaitAuto},
		{args: []string{"--redis-wait-replicas", "AUTO"}, want: relay.WaitAuto},
		{args: []string{"--redis-wait-replicas", "0"}, want: 0},
		{args: []string{"--redis-wait-replicas", "2", "--redis-wait-timeout", "5s"}, want: 2},
		{args: []string{"--redis-wait-replicas", "-1"}, err: "give auto, or a number"},
		{args: []string{"--redis-wait-replicas", "all"}, err: "give auto, or a number"},
		{args: []string{"--redis-wait-timeout", "0s"}, err: "must be above 0"},
		{args: []string{"--redis-wait-timeout", "6s"}, err: "at most 5s"},
	} {
		f := &replicaFlags{}
		cmd := &cobra.Command{Use: "run"}
		f.add(cmd, "")
		err := cmd.ParseFlags(c.args)
		var got int
		if err == nil {
			got, err = f.waitReplicas()
		}
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%v: error %v, want one with %q", c.args, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%v: %d, %v; want %d", c.args, got, err, c.want)
		}
	}
}
