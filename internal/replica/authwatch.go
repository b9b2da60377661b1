package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Once running, a replica whose credentials or permissions are withdrawn
// (an ACL changed, a user disabled) keeps doing what it still can: NATS and
// Redis are asked again at every step, and what is refused is counted,
// logged and makes /readyz not ready until it works again.
const (
	// authLogEvery bounds the log to one line per system and interval
	// while refusals last; the metric counts each.
	authLogEvery = time.Minute
	// refusalHold keeps /readyz not ready after a refusal that nothing
	// clears: a NATS permissions violation (NATS sends no word when a
	// permission comes back), or a Redis command refused once and not run
	// again since. Readiness returns once none has been seen for this
	// long.
	refusalHold = time.Minute
)

// authWatch records authentication and permission refusals after
// start-up. It is passive: the Redis client's hook and the NATS
// connection's callbacks report to it; /readyz reads it.
type authWatch struct {
	log   *slog.Logger
	total *prometheus.CounterVec
	// armed is set once the replica has started: a refusal before that
	// ends Run with the reason instead (errclass.go).
	armed atomic.Bool
	// failing is len(redis), read without the lock so that a success
	// while nothing is refused (every command, nearly always) costs no
	// lock.
	failing atomic.Int32

	mu sync.Mutex
	// hold is refusalHold but in tests.
	hold time.Duration
	// redis holds what Redis refuses now and when it last did: "auth" for
	// the credentials, or the command refused (NOPERM); a later success
	// of the same clears it (any success clears "auth"), as does hold.
	redis map[string]time.Time
	// natsAuth is set while NATS refuses the credentials (cleared on
	// reconnect); natsPerm and natsPermAt are the last permissions
	// violation.
	natsAuth   string
	natsPerm   string
	natsPermAt time.Time
	logs       map[string]*refusalLog // by system
}

// refusalLog bounds the log lines of one system: a refusal line when the
// cause changes or authLogEvery after the last, and a line when the
// system accepts the replica again after a logged refusal, so that even
// refusals that come and go (one connection refused, another not) write
// at most about two lines a minute.
type refusalLog struct {
	at       time.Time // of the last refusal line
	cause    string    // of the last refusal line
	pending  bool      // a refusal line awaits its recovery line
	unlogged int       // refusals since the last refusal line
}

func newAuthWatch(reg *prometheus.Registry, log *slog.Logger) *authWatch {
	w := &authWatch{
		log: log,
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cronstream_auth_errors_total",
			Help: "Authentication and permission errors after start-up, by system (redis, nats).",
		}, []string{"system"}),
		hold:  refusalHold,
		redis: map[string]time.Time{},
		logs:  map[string]*refusalLog{"redis": {}, "nats": {}},
	}
	w.total.WithLabelValues("redis")
	w.total.WithLabelValues("nats")
	reg.MustRegister(w.total)
	return w
}

// refused counts one refusal and logs it (see refusalLog). Called with
// w.mu held.
func (w *authWatch) refused(system, cause string, err error) {
	w.total.WithLabelValues(system).Inc()
	l, now := w.logs[system], time.Now()
	if cause == l.cause && now.Sub(l.at) < authLogEvery {
		l.unlogged++
		return
	}
	w.log.Error(cause+" after start-up: not ready; the replica keeps doing what it still can", "system", system, "err", err, "more_since_last_line", l.unlogged)
	l.at, l.cause, l.pending, l.unlogged = now, cause, true, 0
}

// recovered logs that system accepts the replica again, once per logged
// refusal. Called with w.mu held.
func (w *authWatch) recovered(system string) {
	if l := w.logs[system]; l.pending {
		w.log.Info(map[string]string{"redis": "Redis", "nats": "NATS"}[system]+" accepts the replica again", "system", system)
		l.pending = false
	}
}

// observeRedis records one command's outcome. CONFIG is left out: a
// replica without it only warns that it cannot check Redis's settings.
func (w *authWatch) observeRedis(name string, err error) {
	if !w.armed.Load() || name == "config" {
		return
	}
	key := ""
	switch {
	case err == nil || errors.Is(err, redis.Nil):
	case redis.IsAuthError(err):
		key = "auth"
	case redis.IsPermissionError(err):
		key = name
	default:
		return // not about credentials: other checks and logs cover it
	}
	if key == "" && w.failing.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() { w.failing.Store(int32(len(w.redis))) }()
	if key == "" {
		_, was := w.redis[name]
		_, wasAuth := w.redis["auth"]
		if was || wasAuth {
			delete(w.redis, name)
			delete(w.redis, "auth")
			if len(w.redis) == 0 {
				w.recovered("redis")
			}
		}
		return
	}
	w.redis[key] = time.Now()
	w.refused("redis", unrecoverableCause(err), err)
}

// natsError is the connection's asynchronous error handler: permission
// violations and refused credentials are recorded, other errors (a slow
// consumer) logged.
func (w *authWatch) natsError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if expectedRefusal(err) {
		w.log.Debug("nats: expected refusal (a missing stream this replica may not create, or a consumer the client replaced)", "err", err)
		return
	}
	cause := unrecoverableCause(err)
	if cause == "" || !w.armed.Load() {
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		w.log.Warn("nats: asynchronous error", "err", err, "subscription", subject)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if errors.Is(err, nats.ErrPermissionViolation) {
		w.natsPerm, w.natsPermAt = err.Error(), time.Now()
	} else {
		w.natsAuth = cause
	}
	w.refused("nats", cause, err)
}

// natsReconnected clears refused credentials: the server took them.
func (w *authWatch) natsReconnected(*nats.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.natsAuth != "" {
		w.natsAuth = ""
		if w.natsPerm == "" {
			w.recovered("nats")
		}
	}
}

// check is /readyz's "auth" check.
func (w *authWatch) check(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var reasons []string
	var denied []string
	for k, at := range w.redis {
		switch {
		case time.Since(at) >= w.hold:
			delete(w.redis, k)
		case k == "auth":
			reasons = append(reasons, "Redis refuses the credentials")
		default:
			denied = append(denied, strings.ToUpper(k))
		}
	}
	w.failing.Store(int32(len(w.redis)))
	if len(w.redis) == 0 {
		w.recovered("redis")
	}
	if len(denied) > 0 {
		slices.Sort(denied)
		reasons = append(reasons, "Redis denies "+strings.Join(denied, ", ")+" (NOPERM)")
	}
	if w.natsAuth != "" {
		reasons = append(reasons, w.natsAuth)
	}
	if w.natsPerm != "" {
		if time.Since(w.natsPermAt) < w.hold {
			reasons = append(reasons, w.natsPerm)
		} else {
			w.natsPerm = ""
			if w.natsAuth == "" {
				w.recovered("nats")
			}
		}
	}
	if len(reasons) == 0 {
		return nil
	}
	return fmt.Errorf("refused after start-up: %s", strings.Join(reasons, "; "))
}

// redisHook reports every command's outcome to the watch.
type redisHook struct{ w *authWatch }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.w.observeRedis(cmd.Name(), err)
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.w.observeRedis(c.Name(), c.Err())
		}
		return err
	}
}
