package redisscript_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/redisscript"
	"github.com/cronstream/cronstream/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var incrBy = redisscript.New(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// TestRunLoadsOnNoScript: a call on a server that does not know the script
// (its cache flushed) runs it once, loading it, and the next call finds it.
func TestRunLoadsOnNoScript(t *testing.T) {
	rc := testenv.StartRedis(t).Client(t)
	ctx := context.Background()
	for i, want := range []int64{2, 4} {
		if i == 0 {
			if err := rc.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		n, err := incrBy.Run(ctx, rc, []string{"n"}, 2).Int64()
		if err != nil || n != want {
			t.Fatalf("call %d: %d, %v; want %d", i, n, err, want)
		}
	}
	if ok, err := rc.ScriptExists(ctx, incrBy.Hash()).Result(); err != nil || !ok[0] {
		t.Fatalf("script not loaded after the fallback: %v %v", ok, err)
	}
}

// TestBatchLoadsOnNoScript: a batch on an empty script cache runs every
// call exactly once, in order, with each command holding its own reply;
// plain commands beside the scripts run once too; an error of one call is
// that call's.
func TestBatchLoadsOnNoScript(t *testing.T) {
	rc := testenv.StartRedis(t).Client(t)
	ctx := context.Background()
	fail := redisscript.New(`return redis.error_reply('ERR no luck')`)
	for round := range 2 {
		if err := rc.ScriptFlush(ctx).Err(); err != nil && round == 0 {
			t.Fatal(err)
		}
		b := redisscript.NewBatch(rc)
		plain := b.Pipe().Incr(ctx, "plain")
		first := b.Run(ctx, incrBy, []string{"n"}, 1)
		bad := b.Run(ctx, fail, []string{"n"})
		second := b.Run(ctx, incrBy, []string{"n"}, 10)
		if b.Len() != 3 {
			t.Fatalf("Len = %d", b.Len())
		}
		b.Exec(ctx)
		base := int64(11 * round)
		if n, err := first.Int64(); err != nil || n != base+1 {
			t.Errorf("round %d: first call %d, %v", round, n, err)
		}
		if n, err := second.Int64(); err != nil || n != base+11 {
			t.Errorf("round %d: second call %d, %v", round, n, err)
		}
		if err := bad.Err(); err == nil || err.Error() != "ERR no luck" {
			t.Errorf("round %d: failing call: %v", round, err)
		}
		if n, err := plain.Result(); err != nil || n != int64(round+1) {
			t.Errorf("round %d: plain command %d, %v", round, n, err)
		}
	}
}
