package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/testenv"
)

// attacker is one user of the permissions file trying to write the
// configuration: its connection, and the permission violations the
// server sent it.
type attacker struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
	// violated is cancelled by the first permissions violation the server
	// sends: a refused request gets no answer, so an attempt ends there
	// instead of waiting for its timeout.
	violated context.Context
}

func connectAs(t *testing.T, user, url string) *attacker {
	t.Helper()
	violated, refused := context.WithCancel(context.Background())
	t.Cleanup(refused)
	a := &attacker{user: user, errs: make(chan error, 100), violated: violated}
	nc, err := nats.Connect(url, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if isViolation(err) {
			refused()
		}
		select {
		case a.errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	a.nc = nc
	if a.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return a
}

// refused reports whether the server refused something a did since the
// last call (a permissions violation), or err is one.
func (a *attacker) refused(err error) bool {
	_ = a.nc.Flush()
	got := isViolation(err)
	for {
		select {
		case e := <-a.errs:
			got = got || isViolation(e)
		case <-time.After(300 * time.Millisecond):
			return got
		}
	}
}

// attempt bounds one attempt of a: a refused request gets no answer, so
// it ends at the server's permissions violation, or after 2 s.
func (a *attacker) attempt(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(a.violated, 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// forgedEvent is what the attacker wrote: a complete paused event
// of entry e001 with the source of an operator.
func forgedEvent(t *testing.T) []byte {
	t.Helper()
	e := events.Entry{ID: "e001", Cron: "@every 1m", Task: events.Task{Type: "evil:task"}, PauseOnFailure: true, Paused: true,
		Note: "forged by a replica credential"}
	raw, _ := json.Marshal(e.Normalize())
	ev, err := events.NewEvent(events.TypeEntryPaused+events.GatedSuffix, "cronstream/cli/attacker", "e001", json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ev.Marshal()
	return b
}

// everyone is refused; but lists the users a route is open to (they
// cannot write configuration through it all the same).
func everyone(string) bool { return true }

func but(users ...string) func(string) bool {
	return func(u string) bool {
		for _, x := range users {
			if u == x {
				return false
			}
		}
		return true
	}
}

// writeRoutes are the ways to write into the config subjects other than
// the operator's config events. refusedFor says which users the server
// refuses (a permissions violation); for the others the route is open, and
// what it stores is not configuration. Every route leaves the entry's
// history unchanged, as every reader of the configuration sees it.
var writeRoutes = []struct {
	name       string
	refusedFor func(user string) bool
	// stores: when the server does not refuse it, the route stores a
	// message in the config stream (one the readers skip).
	stores bool
	try    func(t *testing.T, a *attacker) error
}{
	{"publish a config event", but("cronstream-operator"), false, func(t *testing.T, a *attacker) error {
		_, err := a.js.Publish(a.attempt(t), "cronstream.config.e001", forgedEvent(t))
		return err
	}},
	{"a fail-pause request changing the task", but("cronstream-replica", "cronstream-1"), true, func(t *testing.T, a *attacker) error {
		// Conditional on the entry's revision, as a real request is, so
		// the server stores it; the readers refuse it.
		s, err := a.js.Stream(a.attempt(t), "CRONSTREAM_CONFIG")
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(a.attempt(t), "cronstream.*.e001")
		if err != nil {
			return err
		}
		h := nats.Header{}
		ev, _ := events.DecodeEvent(forgedEvent(t))
		h.Set(jetstream.MsgIDHeader, ev.ID)
		h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.Sequence, 10))
		h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "cronstream.*.e001")
		_, err = a.js.PublishMsg(a.attempt(t), &nats.Msg{Subject: "cronstream.failpause.e001", Header: h, Data: forgedEvent(t)})
		return err
	}},
	{"create a stream republishing onto a config subject", everyone, false, func(t *testing.T, a *attacker) error {
		_, err := a.js.CreateStream(a.attempt(t), jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"},
			RePublish: &jetstream.RePublish{Source: "evil.e001", Destination: "cronstream.config.e001"}})
		return err
	}},
	{"update the activity stream to republish onto a config subject", but("cronstream-streams"), false, func(t *testing.T, a *attacker) error {
		cfg, err := events.StreamConfig{}.ActivityStreamConfig()
		if err != nil {
			return err
		}
		cfg.RePublish = &jetstream.RePublish{Source: "cronstream.fire.e001", Destination: "cronstream.config.e001"}
		_, err = a.js.UpdateStream(a.attempt(t), cfg)
		return err
	}},
	{"update the config stream to source the activity stream", but("cronstream-streams"), false, func(t *testing.T, a *attacker) error {
		cfg, err := events.StreamConfig{}.ConfigStreamConfig()
		if err != nil {
			return err
		}
		cfg.Sources = []*jetstream.StreamSource{{Name: "CRONSTREAM_ACTIVITY",
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "cronstream.fire.>", Destination: "cronstream.config.>"}}}}
		_, err = a.js.UpdateStream(a.attempt(t), cfg)
		return err
	}},
	{"create the replicas bucket with a republish", but("cronstream-streams"), false, func(t *testing.T, a *attacker) error {
		_, err := a.js.CreateStream(a.attempt(t), jetstream.StreamConfig{Name: "KV_CRONSTREAM_REPLICAS", Subjects: []string{"$KV.CRONSTREAM_REPLICAS.>"},
			RePublish: &jetstream.RePublish{Source: "$KV.CRONSTREAM_REPLICAS.evil", Destination: "cronstream.config.e001"}})
		return err
	}},
	{"create a stream mirroring the config stream", everyone, false, func(t *testing.T, a *attacker) error {
		_, err := a.js.CreateStream(a.attempt(t), jetstream.StreamConfig{Name: "EVIL", Mirror: &jetstream.StreamSource{Name: "CRONSTREAM_CONFIG"}})
		return err
	}},
	{"create the replicas bucket as a mirror of the activity stream", but("cronstream-streams"), false, func(t *testing.T, a *attacker) error {
		_, err := a.js.CreateStream(a.attempt(t), jetstream.StreamConfig{Name: "KV_CRONSTREAM_REPLICAS", Mirror: &jetstream.StreamSource{Name: "CRONSTREAM_ACTIVITY"}})
		return err
	}},
	{"a push consumer delivering into a config subject", everyone, false, func(t *testing.T, a *attacker) error {
		// The server delivers only where someone subscribes, and no role
		// may subscribe there.
		_, _ = a.js.CreateOrUpdateConsumer(a.attempt(t), "CRONSTREAM_ACTIVITY", jetstream.ConsumerConfig{
			Durable: "push-" + strings.ReplaceAll(a.user, "-", ""), DeliverSubject: "cronstream.config.e001", DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy})
		_, err := a.nc.SubscribeSync("cronstream.config.e001")
		return err
	}},
	{"a pull request delivered to a config subject", but("cronstream-replica", "cronstream-1", "cronstream-operator", "cronstream-auditor"), true, func(t *testing.T, a *attacker) error {
		name := "pull-" + strings.ReplaceAll(a.user, "-", "")
		if _, err := a.js.CreateOrUpdateConsumer(a.attempt(t), "CRONSTREAM_ACTIVITY", jetstream.ConsumerConfig{Name: name, AckPolicy: jetstream.AckNonePolicy}); err != nil {
			return err
		}
		return a.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.CRONSTREAM_ACTIVITY."+name, "cronstream.config.e001", []byte(`{"batch":5,"no_wait":true}`))
	}},
	{"a direct get answered on a config subject", but("cronstream-replica", "cronstream-1", "cronstream-operator", "cronstream-auditor"), true, func(t *testing.T, a *attacker) error {
		return a.nc.PublishRequest("$JS.API.DIRECT.GET.CRONSTREAM_ACTIVITY", "cronstream.config.e001", []byte(`{"last_by_subj":"cronstream.fire.e001"}`))
	}},
	{"an API answer stored on a config subject", func(string) bool { return false }, true, func(t *testing.T, a *attacker) error {
		return a.nc.PublishRequest("$JS.API.STREAM.INFO.CRONSTREAM_CONFIG", "cronstream.config.e001", nil)
	}},
	{"a publish acknowledgement stored on a config subject", but("cronstream-replica", "cronstream-1"), true, func(t *testing.T, a *attacker) error {
		return a.nc.PublishMsg(&nats.Msg{Subject: "cronstream.fire.e001", Reply: "cronstream.config.e001", Data: forgedEvent(t)})
	}},
	{"a KV put carrying a config event", but("cronstream-replica"), false, func(t *testing.T, a *attacker) error {
		_, err := a.js.Publish(a.attempt(t), "$KV.CRONSTREAM_REPLICAS.evil", forgedEvent(t))
		return err
	}},
	{"a heartbeat under another replica's key", but("cronstream-replica"), false, func(t *testing.T, a *attacker) error {
		_, err := a.js.Publish(a.attempt(t), "$KV.CRONSTREAM_REPLICAS.cronstream-2", []byte(`{"id":"cronstream-2"}`))
		return err
	}},
	{"purge or delete the config stream, delete a message", everyone, false, func(t *testing.T, a *attacker) error {
		for _, s := range []string{"$JS.API.STREAM.PURGE.CRONSTREAM_CONFIG", "$JS.API.STREAM.DELETE.CRONSTREAM_CONFIG", "$JS.API.STREAM.MSG.DELETE.CRONSTREAM_CONFIG"} {
			if err := a.nc.Publish(s, []byte(`{"seq":1}`)); err != nil {
				return err
			}
		}
		return nil
	}},
	{"delete another client's consumer", everyone, false, func(t *testing.T, a *attacker) error {
		return a.nc.Publish("$JS.API.CONSUMER.DELETE.CRONSTREAM_CONFIG.someone", nil)
	}},
}

var routeUsers = []string{"cronstream-replica", "cronstream-1", "cronstream-operator", "cronstream-auditor", "cronstream-streams"}

// TestConfigWriteRoutes: with the repository's permissions file, as each
// user, every route into the config subjects is tried: a publish, a
// stream or the bucket made or changed to republish, source or mirror, a
// push consumer, a pull or a direct get delivered there, the server's
// answers stored there, a KV put, a heartbeat under another replica's key,
// and the attack of issue 34 (NATS restarted, the bucket made again by a
// replica with a republish onto a config subject). Each is refused by the
// server, or stores nothing any reader of the configuration applies:
// `entry history` and `entry get` stay as they were, and no entry is
// quarantined. The streams role, the one that administers streams, may add
// a republish or make the bucket a mirror: `streams apply` and a starting
// replica then refuse the stream, naming the route.
func TestConfigWriteRoutes(t *testing.T) {
	t.Parallel()
	n, url := permissionsServer(t)
	r := testenv.StartRedis(t, testenv.WithPrivateServer())
	env := func(user string) *cliEnv {
		return &cliEnv{t: t, nats: n, redis: r, vars: append(baseEnv(), "CRONSTREAM_NATS="+url(user), "CRONSTREAM_REDIS="+r.URL)}
	}
	streams, operator, auditor := env("cronstream-streams"), env("cronstream-operator"), env("cronstream-auditor")
	streams.ok("streams", "apply")
	operator.ok("entry", "put", "e001", "--cron", "@every 1m", "--type", "report", "--pause-on-failure")
	operator.ok("entry", "put", "e002", "--cron", "@every 1m", "--type", "other")
	// The entry as `entry get` shows it, without its revision (the last
	// message of its subjects: a message the readers skip moves it) and
	// next fire.
	state := func() string {
		var e events.Entry
		auditor.okJSON(&e, "entry", "get", "e001", "--json")
		b, _ := json.Marshal(e)
		return string(b)
	}
	history, entry := auditor.ok("entry", "history", "e001", "--json"), state()
	unchanged := func(t *testing.T, after string) {
		t.Helper()
		if got := auditor.ok("entry", "history", "e001", "--json"); got != history {
			t.Fatalf("%s: entry history changed:\n%s\nwas:\n%s", after, got, history)
		}
		if got := state(); got != entry {
			t.Fatalf("%s: entry changed:\n%s\nwas:\n%s", after, got, entry)
		}
	}
	notQuarantined := func(t *testing.T, after string) {
		t.Helper()
		var st struct {
			Entries struct {
				Quarantined int `json:"quarantined"`
			} `json:"entries"`
		}
		auditor.okJSON(&st, "status", "--json")
		if st.Entries.Quarantined != 0 {
			t.Fatalf("%s: %d entries quarantined", after, st.Entries.Quarantined)
		}
	}
	// Something in the activity stream for the deliveries to carry.
	replica := connectAs(t, "cronstream-replica", url("cronstream-replica"))
	if _, err := replica.js.Publish(replica.attempt(t), "cronstream.fire.e001", forgedEvent(t)); err != nil {
		t.Fatal(err)
	}

	configSeq := func() uint64 {
		s, err := replica.js.Stream(replica.attempt(t), "CRONSTREAM_CONFIG")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}
	for _, route := range writeRoutes {
		t.Run(route.name, func(t *testing.T) {
			for _, user := range routeUsers {
				open := !route.refusedFor(user)
				if open && (user == "cronstream-operator" && route.name == "publish a config event" ||
					user == "cronstream-streams" && (strings.Contains(route.name, "update") || strings.Contains(route.name, "bucket"))) {
					// What the operator (config events) and the streams
					// role (stream settings) may do by design; the
					// latter's is tested below.
					continue
				}
				before := configSeq()
				a := connectAs(t, user, url(user))
				err := route.try(t, a)
				if refused := a.refused(err); refused == open {
					t.Errorf("%s: refused by the server %t, want %t (err %v)", user, refused, !open, err)
				}
				if open && route.stores {
					// The route did write into the config stream.
					testenv.Eventually(t, 5*time.Second, func() bool { return configSeq() > before }, "%s: nothing stored", user)
				}
				unchanged(t, user+": "+route.name)
			}
			notQuarantined(t, route.name)
		})
	}

	t.Run("issue 34: NATS restarted, the bucket made again by a replica", func(t *testing.T) {
		n.Restart(t)
		// On file, the bucket is still there after a restart of every node.
		streams.ok("streams", "apply", "--dry-run")
		if out := streams.ok("streams", "apply", "--dry-run"); !strings.Contains(out, "KV_CRONSTREAM_REPLICAS: unchanged") {
			t.Fatalf("the bucket did not survive the restart:\n%s", out)
		}
		// A bucket lost anyway (an earlier build's, in memory): replicas
		// cannot make it, let alone with a republish.
		st := connectAs(t, "cronstream-streams", url("cronstream-streams"))
		if err := st.js.DeleteStream(st.attempt(t), "KV_CRONSTREAM_REPLICAS"); err != nil {
			t.Fatal(err)
		}
		for _, user := range []string{"cronstream-replica", "cronstream-1"} {
			a := connectAs(t, user, url(user))
			_, err := a.js.CreateStream(a.attempt(t), jetstream.StreamConfig{Name: "KV_CRONSTREAM_REPLICAS", Subjects: []string{"$KV.CRONSTREAM_REPLICAS.>"},
				RePublish: &jetstream.RePublish{Source: "$KV.CRONSTREAM_REPLICAS.evil", Destination: "cronstream.config.e001"}})
			if !a.refused(err) {
				t.Errorf("%s made the bucket: %v", user, err)
			}
			_ = a.nc.Publish("$KV.CRONSTREAM_REPLICAS.evil", forgedEvent(t))
			a.refused(nil)
		}
		unchanged(t, "after the issue's attack")
		notQuarantined(t, "after the issue's attack")
		streams.ok("streams", "apply")
	})

	t.Run("the streams role adds a republish", func(t *testing.T) {
		st := connectAs(t, "cronstream-streams", url("cronstream-streams"))
		s, err := st.js.Stream(st.attempt(t), "CRONSTREAM_ACTIVITY")
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.RePublish = &jetstream.RePublish{Source: "cronstream.fire.e001", Destination: "cronstream.config.e001"}
		if _, err := st.js.UpdateStream(st.attempt(t), cfg); err != nil {
			t.Fatal(err)
		}
		if msg := streams.fail("streams", "apply"); !strings.Contains(msg, "republish") {
			t.Errorf("streams apply on a republishing stream: %s", msg)
		}
		p := start(t, env("cronstream-1").vars, "run", "--http", "", "--replica-id", "cronstream-1")
		if code := p.stop(syscall.Signal(0), 20*time.Second); code == 0 || !strings.Contains(p.Stderr(), "republish") {
			t.Errorf("a replica started on a republishing stream: exit %d\n%s", code, p.Stderr())
		}
		cfg.RePublish = nil
		if _, err := st.js.UpdateStream(st.attempt(t), cfg); err != nil {
			t.Fatal(err)
		}
		streams.ok("streams", "apply")
	})

	t.Run("the streams role makes the bucket a mirror", func(t *testing.T) {
		// A mirror cannot be added to an existing stream: the streams
		// role, which may delete the bucket, makes it again as one.
		st := connectAs(t, "cronstream-streams", url("cronstream-streams"))
		if err := st.js.DeleteStream(st.attempt(t), "KV_CRONSTREAM_REPLICAS"); err != nil {
			t.Fatal(err)
		}
		if _, err := st.js.CreateStream(st.attempt(t), jetstream.StreamConfig{Name: "KV_CRONSTREAM_REPLICAS", Mirror: &jetstream.StreamSource{Name: "CRONSTREAM_ACTIVITY"}}); err != nil {
			t.Fatal(err)
		}
		if msg := streams.fail("streams", "apply"); !strings.Contains(msg, "mirror") {
			t.Errorf("streams apply on a mirrored bucket: %s", msg)
		}
		p := start(t, env("cronstream-1").vars, "run", "--http", "", "--replica-id", "cronstream-1")
		if code := p.stop(syscall.Signal(0), 20*time.Second); code == 0 || !strings.Contains(p.Stderr(), "mirror") {
			t.Errorf("a replica started on a mirrored bucket: exit %d\n%s", code, p.Stderr())
		}
		if err := st.js.DeleteStream(st.attempt(t), "KV_CRONSTREAM_REPLICAS"); err != nil {
			t.Fatal(err)
		}
		streams.ok("streams", "apply")
		unchanged(t, "after the mirrored bucket")
	})
}
