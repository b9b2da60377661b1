package replica

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRunEndsOnWhatRetryingCannotFix: refused Redis credentials, a missing
// Redis permission and impossible stream settings end Run at start-up with
// ErrUnrecoverable instead of a retry loop.
func TestRunEndsOnWhatRetryingCannotFix(t *testing.T) {
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t, testenv.WithPrivateServer())
	admin := rd.Client(t)
	ctx := context.Background()
	for _, args := range [][]any{
		{"ACL", "SETUSER", "cron", "on", ">right", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "tiny", "on", ">right", "~*", "-@all", "+ping", "+hello", "+auth", "+client"},
	} {
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	client := func(user, pw string) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: rd.Addr, Username: user, Password: pw})
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"wrong Redis password", Config{Redis: client("cron", "wrong")}, "Redis refused the credentials"},
		{"Redis NOPERM", Config{Redis: client("tiny", "right")}, "lacks a permission"},
		{"activity max age below the duplicate window", Config{Redis: client("cron", "right"), ActivityMaxAge: 5 * time.Minute}, "duplicate window"},
		{"three replicas on one server", Config{Redis: client("cron", "right"), StreamReplicas: 3}, "stream settings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.NATSURL, cfg.Names, cfg.Logger = ns.URL(), events.MustNames(strings.ReplaceAll(tc.name, " ", "")), quietLogger()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, cfg)
			if !errors.Is(err, ErrUnrecoverable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want ErrUnrecoverable with %q", err, tc.want)
			}
		})
	}
}
