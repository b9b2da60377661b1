package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// session is what a one-shot command holds: its NATS connection, the
// names of the tenant and a config client publishing as the CLI user.
type session struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  events.Names
	client *events.Client
	source string
	// activityMaxAge is the activity stream's max age, read once by
	// checkCatchup (nil: not read yet).
	activityMaxAge *time.Duration
}

// openSession validates --prefix (before any connection, so a typo is
// reported as such) and connects to NATS. The caller closes it.
func openSession(g *globalFlags, c *connFlags) (*session, error) {
	names, err := g.names()
	if err != nil {
		return nil, err
	}
	nc, js, err := connectNATS(g, c)
	if err != nil {
		return nil, err
	}
	src := cliSource()
	return &session{nc: nc, js: js, names: names, source: src,
		client: events.NewClient(js, names, events.WithSource(src))}, nil
}

func (s *session) Close() { s.nc.Close() }

// cliSource is the CloudEvents source of what the CLI publishes: the tool
// and the user, so the audit log says who changed what.
func cliSource() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	name = strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r < 0x20 {
			return '_'
		}
		return r
	}, name)
	if name == "" {
		return "cronstream/cli"
	}
	return "cronstream/cli/" + name
}

// errNoStreams explains a missing stream: nothing ran yet, or --prefix is
// wrong.
func (s *session) errNoStreams(stream string) error {
	return fmt.Errorf("stream %s does not exist: no cronstream replica or `entry put` has used prefix %q on this NATS yet (check --prefix / CRONSTREAM_PREFIX)", stream, s.names.Prefix())
}

// openStreamsSession is openSession for commands that read or write the
// streams: it fails, closing what it opened, when they do not exist.
func openStreamsSession(ctx context.Context, g *globalFlags, c *connFlags) (*session, error) {
	s, err := openSession(g, c)
	if err != nil {
		return nil, err
	}
	if err := s.requireStreams(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// requireStreams checks that the config and activity streams exist, for
// commands that only read.
func (s *session) requireStreams(ctx context.Context) error {
	for _, name := range []string{s.names.ConfigStream(), s.names.ActivityStream()} {
		if _, err := s.js.Stream(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return s.errNoStreams(name)
			}
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	return nil
}

// ensureStreams creates the streams when they do not exist yet, so entries
// can be configured before the first replica starts. It never changes
// existing streams: their settings are `cronstream streams apply`'s.
func (s *session) ensureStreams(ctx context.Context) error {
	if _, err := events.SyncStreams(ctx, s.js, events.StreamConfig{Names: s.names}, events.CreateMissing); err != nil {
		return fmt.Errorf("create streams: %w", err)
	}
	return nil
}

// checkCatchup refuses an entry whose catch-up window reaches back further
// than the activity stream keeps the fired events catch-up reads.
func (s *session) checkCatchup(ctx context.Context, e events.Entry) error {
	if s.activityMaxAge == nil {
		age, err := events.ActivityMaxAge(ctx, s.js, s.names)
		if err != nil {
			return fmt.Errorf("read the activity retention to check the catch-up window: %w", err)
		}
		s.activityMaxAge = &age
	}
	if err := events.CatchupBeyondRetention(e, *s.activityMaxAge); err != nil {
		return fmt.Errorf("%w\nnothing was published", err)
	}
	return nil
}

// openStore connects to Redis for commands that fire (trigger, backfill)
// or read queue state (status).
func openStore(ctx context.Context, g *globalFlags, c *connFlags) (*taskstate.Store, redis.UniversalClient, error) {
	rc, err := openRedis(g, c)
	if err != nil {
		return nil, nil, err
	}
	if err := pingRedis(ctx, rc, g); err != nil {
		rc.Close()
		return nil, nil, err
	}
	return taskstate.New(rc), rc, nil
}

// addConn adds the NATS connection flags (and the Redis ones when
// withRedis) to a one-shot command.
func addConn(cmd *cobra.Command, c *connFlags, withRedis bool) {
	c.addNATS(cmd)
	if withRedis {
		c.addRedis(cmd)
	}
}
