package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
	"github.com/cronstream/cronstream/internal/ownership"
	"github.com/cronstream/cronstream/internal/redact"
	"github.com/cronstream/cronstream/internal/relay"
	"github.com/cronstream/cronstream/internal/scheduler"
	"github.com/cronstream/cronstream/internal/stall"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/projector"
)

// start brings the replica up, one step after another: each step's
// components are what the next ones read.
func (r *Replica) start(ctx context.Context) error {
	if err := r.connectNATS(); err != nil {
		return err
	}
	kv, streamWarnings, err := r.openStreams(ctx, r.js)
	if err != nil {
		return err
	}
	if err := r.connectRedis(ctx); err != nil {
		return err
	}
	if err := r.startProjection(ctx); err != nil {
		return err
	}
	if err := r.newStallDetector(); err != nil {
		return err
	}
	if err := r.startMembership(ctx, kv, streamWarnings); err != nil {
		return err
	}
	if err := r.startRelay(ctx); err != nil {
		return err
	}
	if err := r.startFiring(ctx); err != nil {
		return err
	}
	return r.startDuties(ctx)
}

// connectNATS connects to NATS, waiting for a server that is down; refused
// credentials and bad stream settings are errors at once.
func (r *Replica) connectNATS() error {
	opts := append([]nats.Option{
		nats.Name("cronstream " + r.cfg.ReplicaID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		// Nothing of this connection's own needs hearing back.
		nats.NoEcho(),
		// Refusals after start-up are counted and make /readyz not
		// ready (authwatch.go); reconnecting goes on, so restored
		// credentials are taken up.
		nats.ErrorHandler(r.auth.natsError),
		nats.ReconnectHandler(r.auth.natsReconnected),
		nats.IgnoreAuthErrorAbort(),
	}, r.cfg.NATSOptions...)
	streams := events.StreamConfig{Names: r.cfg.Names, Replicas: r.cfg.StreamReplicas, ActivityMaxAge: r.cfg.ActivityMaxAge, DuplicateWindow: r.cfg.DuplicateWindow}
	if _, err := streams.ActivityStreamConfig(); err != nil {
		return fmt.Errorf("%w (stream settings): %w", ErrUnrecoverable, err)
	}
	// A first attempt without RetryOnFailedConnect, so refused credentials
	// are an error now rather than a reconnect loop; a server that is down
	// is waited for.
	nc, err := nats.Connect(r.cfg.NATSURL, opts...)
	if err != nil {
		if fatal := unrecoverable(err, nil); fatal != nil {
			return fmt.Errorf("nats %s: %w", redact.URL(r.cfg.NATSURL), fatal)
		}
		r.log.Warn("not ready: NATS unreachable, retrying", "nats", redact.URL(r.cfg.NATSURL), "err", err)
		r.mu.Lock()
		r.startBlocked = "NATS: " + err.Error()
		r.mu.Unlock()
		nc, err = nats.Connect(r.cfg.NATSURL, append(opts, nats.RetryOnFailedConnect(true))...)
	}
	if err != nil {
		return fmt.Errorf("nats %s: %w", redact.URL(r.cfg.NATSURL), err)
	}
	r.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	r.js = js
	if r.http != nil {
		r.http.addCheck("nats", func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("not connected to NATS (%s)", nc.Status())
			}
			return nil
		})
		r.http.addCheck("redis", func(ctx context.Context) error { return r.cfg.Redis.Ping(ctx).Err() })
		r.http.addCheck("auth", r.auth.check)
	}
	r.cfg.Redis.AddHook(redisHook{r.auth})
	return nil
}

// connectRedis makes the task store and the clock corrected to Redis
// TIME, waiting for Redis, and warns of an unsafe Redis configuration.
func (r *Replica) connectRedis(ctx context.Context) error {
	r.store = taskstate.New(r.cfg.Redis)
	r.clock = clock.New(r.store.Time, clock.Options{LocalOffset: r.cfg.ClockOffset})
	if r.cfg.ClockOffset != 0 {
		r.log.Warn("test only: this replica's local clock is offset", "offset", r.cfg.ClockOffset)
	}
	if err := r.retry(ctx, "redis", func(ctx context.Context) error { return r.clock.Sync(ctx) }); err != nil {
		return err
	}
	r.warnRedisConfig(ctx)
	return nil
}

// startProjection starts following the config stream, waiting for it,
// and exports the projection's metrics and readiness.
func (r *Replica) startProjection(ctx context.Context) error {
	var err error
	if r.proj, err = projector.New(projector.Config{JS: r.js, Names: r.cfg.Names, Logger: r.log, Now: r.clock.Now}); err != nil {
		return err
	}
	if err := r.retry(ctx, "projector", r.proj.Start); err != nil {
		return err
	}
	r.registerProjectionMetrics()
	if r.http != nil {
		r.http.addCheck("projection", func(context.Context) error {
			if !r.proj.CaughtUp() {
				return errors.New("projection not caught up with the config stream")
			}
			// On an idle stream LastHeard moves only with the consumer's
			// heartbeats and lags by up to about four of them; without
			// that allowance a healthy replica with a short max-staleness
			// (under ~9 s) flaps between ready and not ready.
			if age := r.clock.Now().Sub(r.proj.LastHeard()); age > r.maxStaleness()+4*projector.DefaultHeartbeat {
				return fmt.Errorf("config stream not heard for %s", age.Round(time.Second))
			}
			return nil
		})
	}
	return nil
}

// newStallDetector builds the stall detector before the heartbeat, which
// reports its late entries, and the scheduler, which reports its outcomes
// to it; startFiring starts it after the scheduler, once the projection
// is caught up.
func (r *Replica) newStallDetector() error {
	det, err := stall.New(stall.Config{
		Watermarks: r.store, Projection: r.proj, Names: r.cfg.Names, Now: r.clock.Now,
		LateAfter: r.cfg.LateAfter, Logger: r.log, Metrics: stall.NewMetrics(r.reg),
		// Read by the detector's checks, which start after r.sched is set.
		Holding: func() string {
			if s := r.sched; s != nil && s.Paused() {
				return "firing paused: outbox backlog over --max-outbox-bytes"
			}
			return ""
		},
	})
	if err != nil {
		return err
	}
	r.stall = det
	return nil
}

// startMembership writes this replica's first heartbeat, waiting for
// NATS, and beats and follows the others' from then on.
func (r *Replica) startMembership(ctx context.Context, kv jetstream.KeyValue, streamWarnings []string) error {
	hostname, _ := os.Hostname()
	var err error
	r.members, err = NewMembership(MembershipConfig{
		KV: kv, JS: r.js,
		Self:     Info{ID: r.cfg.ReplicaID, Host: hostname, PID: os.Getpid(), Started: r.clock.Now().UTC(), Version: r.cfg.Version, HTTP: r.httpAddr(), Warnings: streamWarnings},
		Interval: r.cfg.Heartbeat, Logger: r.log, Now: r.clock.Now,
		Update: r.beatUpdate(streamWarnings), Frozen: r.viewFrozen,
	})
	if err != nil {
		return err
	}
	if err := r.retry(ctx, "heartbeat", r.members.Start); err != nil {
		return err
	}
	if r.http != nil {
		r.http.addCheck("membership", func(context.Context) error { return r.members.Missing() })
		r.http.addCheck("streams", func(context.Context) error { return r.routes.ready() })
	}
	return nil
}

// startRelay starts publishing the outboxes of the queues whose duties
// this replica holds. The relay yields the cores to a burst of fires (at
// most its MaxHold); it is built before the scheduler, so it reads it
// through a pointer.
func (r *Replica) startRelay(ctx context.Context) error {
	var err error
	r.relay, err = relay.New(relay.Config{
		Outbox: r.store, JS: r.js, Names: r.cfg.Names, Owner: r.cfg.ReplicaID,
		Hold:            func() bool { s := r.firing.Load(); return s != nil && s.Busy() },
		DuplicateWindow: cmp.Or(max(r.cfg.DuplicateWindow, 0), events.DefaultDuplicateWindow), Now: r.clock.Now,
		Logger: r.log, Metrics: relay.NewMetrics(r.reg),
		WaitReplicas: r.cfg.RedisWaitReplicas, WaitTimeout: r.cfg.RedisWaitTimeout,
		OnPublished: r.stall.ObservePublished,
		// The outboxes of the queues whose duties this replica holds
		// (ownership, built in startFiring).
		Owns: r.holdsQueue,
	})
	if err != nil {
		return err
	}
	return r.relay.Start(ctx)
}

// startFiring starts the scheduler, once the projection is caught up, then
// the shard ownership it follows and the stall detector that watches it.
func (r *Replica) startFiring(ctx context.Context) error {
	if err := r.newOwnership(); err != nil {
		return err
	}
	det := r.stall
	sched, err := scheduler.New(scheduler.Config{
		Redis: r.cfg.Redis, Projection: r.proj, Shards: r.own, Names: r.cfg.Names,
		ReplicaID: r.cfg.ReplicaID, Clock: r.clock, Grace: r.cfg.Grace,
		MaxStaleness: r.cfg.MaxStaleness, OutboxBytes: r.relay.BacklogBytes, MaxOutboxBytes: r.cfg.MaxOutboxBytes,
		OnFire: r.relay.Notify, OnOutcome: det.Outcome, Logger: r.log, Metrics: scheduler.NewMetrics(r.reg),
		History: scheduler.NewStreamHistory(r.js, r.cfg.Names),
	})
	if err != nil {
		return err
	}
	r.sched = sched
	r.reg.MustRegister(sched.Collector(r.cfg.MetricsPerEntry))
	r.firing.Store(sched)
	r.relayed.Store(r.relay)
	if err := sched.Start(ctx); err != nil {
		return err
	}
	// Ready now (the projection is caught up): said at once, so that the
	// other replicas and this one's ownership count this replica in.
	r.members.Refresh()
	if err := r.own.Start(ctx); err != nil {
		return err
	}
	det.SetFiring(sched.Firing)
	det.SetShards(r.own)
	if err := det.Start(ctx); err != nil {
		return err
	}
	if r.http != nil {
		r.http.addCheck("stall", func(context.Context) error { return det.Ready() })
		r.http.addCheck("shards", func(context.Context) error { return r.own.Ready() })
		r.http.addCheck("outbox", func(context.Context) error {
			if sched.Paused() {
				return fmt.Errorf("outbox backlog of %d records takes %d bytes, over --max-outbox-bytes %d: firing paused", r.relay.Backlog(), r.relay.BacklogBytes(), r.cfg.MaxOutboxBytes)
			}
			return nil
		})
	}
	return nil
}

// newOwnership builds the shard ownership the scheduler follows
// (started once the scheduler runs).
func (r *Replica) newOwnership() error {
	own, err := ownership.New(ownership.Config{
		Store: r.store, Members: r.members, Names: r.cfg.Names, ReplicaID: r.cfg.ReplicaID,
		Queues: r.proj.Queues, Ready: r.readyToOwn, HeardNATS: r.heardNATS, Clock: r.clock,
		MemberTTL: 3 * r.cfg.Heartbeat, UnownedReadyAfter: r.lateAfter(), Logger: r.log, Metrics: ownership.NewMetrics(r.reg),
	})
	if err != nil {
		return err
	}
	r.own = own
	r.owner.Store(own)
	return nil
}

// retry runs f with exponential backoff until it succeeds or ctx ends. An
// error retrying cannot fix (credentials, permissions, settings) ends it at
// once: a replica that can never start says why and exits.
func (r *Replica) retry(ctx context.Context, what string, f func(context.Context) error) error {
	backoff := 100 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fatal := unrecoverable(err, r.nc); fatal != nil {
			return fmt.Errorf("%s: %w", what, fatal)
		}
		r.log.Warn("not ready: transient error, retrying", "step", what, "err", err, "in", backoff)
		r.mu.Lock()
		r.startBlocked = what + ": " + err.Error()
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}
