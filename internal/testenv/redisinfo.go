package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisInfo returns the fields of INFO section of the server rc talks to,
// by name.
func RedisInfo(t testing.TB, rc redis.UniversalClient, section string) map[string]string {
	t.Helper()
	info, err := rc.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// RedisPID is the process id of the server rc talks to.
func RedisPID(t testing.TB, rc redis.UniversalClient) int {
	t.Helper()
	pid, err := strconv.Atoi(RedisInfo(t, rc, "server")["process_id"])
	if err != nil {
		t.Fatalf("INFO server: process_id: %v", err)
	}
	return pid
}

// RedisCPU is the CPU time, user and system, the server rc talks to has
// used: unlike wall time it does not grow when other processes share the
// machine.
func RedisCPU(t testing.TB, rc redis.UniversalClient) time.Duration {
	t.Helper()
	info := RedisInfo(t, rc, "cpu")
	var secs float64
	for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, err := strconv.ParseFloat(info[name], 64)
		if err != nil {
			t.Fatalf("INFO cpu: %s: %v", name, err)
		}
		secs += f
	}
	return time.Duration(secs * float64(time.Second))
}

// CommandStat is what Redis counts of one command since its last CONFIG
// RESETSTAT: the calls, inside scripts too, and the server time they took.
type CommandStat struct {
	Calls int64
	Usec  int64
}

// RedisCommandStats returns INFO commandstats of the server rc talks to by
// command name, as Redis names them ("evalsha", "xrange", "client|list").
func RedisCommandStats(t testing.TB, rc redis.UniversalClient) map[string]CommandStat {
	t.Helper()
	out := map[string]CommandStat{}
	for name, fields := range RedisInfo(t, rc, "commandstats") {
		cmd, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var c CommandStat
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				c.Calls = n
			case "usec":
				c.Usec = n
			}
		}
		out[cmd] = c
	}
	return out
}
