package replica

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// routeCheckEvery spaces the checks of the streams' write routes.
const routeCheckEvery = time.Minute

// routeWatch checks, at start (events.SyncStreams refuses such a stream:
// the replica does not start) and every minute while running, that no
// setting of cronstream's streams and bucket makes the server write them
// other than a client's publish (events.WriteRoute): a mirror, sources, a
// subject transform or a republish, which could put configuration there
// that no operator published. One it finds is an error line (when the set
// found changes), a warning in the heartbeat (status) and /readyz not
// ready, while it lasts; firing goes on with the configuration the stream
// holds.
type routeWatch struct {
	mu     sync.Mutex
	last   time.Time // of the last check
	routes []string
}

func (w *routeWatch) check(ctx context.Context, js jetstream.JetStream, names events.Names, log *slog.Logger) {
	w.mu.Lock()
	due := time.Since(w.last) >= routeCheckEvery
	if due {
		w.last = time.Now()
	}
	w.mu.Unlock()
	if !due {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	routes, err := events.StreamWriteRoutes(cctx, js, names)
	if err != nil {
		return // NATS unreachable or slow: other checks say so; next time
	}
	w.mu.Lock()
	changed := !slices.Equal(routes, w.routes)
	w.routes = routes
	w.mu.Unlock()
	switch {
	case changed && len(routes) > 0:
		log.Error("a stream of cronstream can be written other than by a publish (a mirror, sources, a subject transform or a republish): configuration may come from elsewhere than the operators; remove it", "routes", routes)
	case changed:
		log.Info("the streams of cronstream are written by publishes alone again")
	}
}

func (w *routeWatch) warnings() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, len(w.routes))
	for i, r := range w.routes {
		out[i] = "stream " + r + ": the server writes this stream other than by a publish; remove it"
	}
	return out
}

func (w *routeWatch) ready() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.routes) == 0 {
		return nil
	}
	return errors.New("streams written other than by a publish: " + strings.Join(w.routes, "; "))
}
