package console_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/console"
	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/replicatest"
	"github.com/cronstream/cronstream/internal/taskstate"
	"github.com/cronstream/cronstream/internal/testenv"
)

// site is a running replica serving the console, with real NATS and Redis.
type site struct {
	t      *testing.T
	addr   string
	names  events.Names
	js     jetstream.JetStream
	client *events.Client
	// store reads the replica's Redis, as status does.
	store *taskstate.Store
}

// startSite runs a replica with the console until the test ends.
func startSite(t *testing.T, cfg console.Config) *site {
	t.Helper()
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	names := events.MustNames("console")
	s := &site{t: t, names: names, js: ns.JetStream(t), store: taskstate.New(rd.Client(t))}
	s.addr = replicatest.Start(t, replica.Config{
		NATSURL: ns.URL(), Redis: rd.Client(t), Names: names, ReplicaID: "console-r1", Console: &cfg,
	}).Addr
	s.client = events.NewClient(s.js, names, events.WithSource("console-test"))
	return s
}

func (s *site) url(path string) string { return "http://" + s.addr + path }

// get fetches path and returns the status, headers and body.
func (s *site) get(path string, header ...string) (int, http.Header, string) {
	s.t.Helper()
	return s.do(http.MethodGet, path, header...)
}

func (s *site) do(method, path string, header ...string) (int, http.Header, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url(path), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// page fetches a page that must answer 200 and returns its body.
func (s *site) page(path string) string {
	s.t.Helper()
	code, _, body := s.get(path)
	if code != http.StatusOK {
		s.t.Fatalf("GET %s: %d\n%.3000s", path, code, body)
	}
	return body
}

// put registers an entry and waits until the console shows it.
func (s *site) put(e events.Entry) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.client.Put(ctx, e); err != nil {
		s.t.Fatalf("put %s: %v", e.ID, err)
	}
}

// waitFor waits until path's body contains want.
func (s *site) waitFor(path, want string) string {
	s.t.Helper()
	var body string
	testenv.Eventually(s.t, 10*time.Second, func() bool {
		_, _, body = s.get(path)
		return strings.Contains(body, want)
	}, "%s never showed %q", path, want)
	return body
}
