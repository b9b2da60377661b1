package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness condition; it returns nil when satisfied.
type Check func(ctx context.Context) error

// httpServer serves /healthz (the process is alive), /readyz (every check
// passes) and /metrics.
type httpServer struct {
	mux    *http.ServeMux
	srv    *http.Server
	ln     net.Listener
	log    *slog.Logger
	mu     sync.RWMutex
	checks map[string]Check
	wg     sync.WaitGroup
}

func newHTTPServer(addr string, reg *prometheus.Registry, log *slog.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	h := &httpServer{ln: ln, log: log, checks: map[string]Check{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", h.ready)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	h.mux = mux
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return h, nil
}

// mount serves handler under pattern (the console at "/": the other
// paths stay theirs, being more specific).
func (h *httpServer) mount(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// Addr is where the server listens.
func (h *httpServer) Addr() string { return h.ln.Addr().String() }

func (h *httpServer) addCheck(name string, c Check) {
	h.mu.Lock()
	h.checks[name] = c
	h.mu.Unlock()
}

// checkTimeout bounds each readiness check.
const checkTimeout = 2 * time.Second

// Ready runs every check, concurrently, and returns the failures by name.
// A check that does not answer within checkTimeout fails (a Redis
// connection that stalls must not stall /readyz); it finishes on its own.
func (h *httpServer) Ready(ctx context.Context) map[string]string {
	h.mu.RLock()
	checks := make(map[string]Check, len(h.checks))
	for n, c := range h.checks {
		checks[n] = c
	}
	h.mu.RUnlock()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(checks)) // room for every late answer
	for n, c := range checks {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			defer cancel()
			results <- result{n, c(cctx)}
		}()
	}
	failed := map[string]string{}
	timeout := time.NewTimer(checkTimeout + 100*time.Millisecond)
	defer timeout.Stop()
	for pending := len(checks); pending > 0; pending-- {
		select {
		case r := <-results:
			if r.err != nil {
				failed[r.name] = r.err.Error()
			}
			delete(checks, r.name)
		case <-timeout.C:
			for n := range checks {
				failed[n] = fmt.Sprintf("no answer within %s", checkTimeout)
			}
			return failed
		}
	}
	return failed
}

func (h *httpServer) ready(w http.ResponseWriter, r *http.Request) {
	failed := h.Ready(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "failed": failed})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
}

func (h *httpServer) start() {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("http server", "err", err)
		}
	}()
}

func (h *httpServer) stop(ctx context.Context) {
	_ = h.srv.Shutdown(ctx)
	h.wg.Wait()
}
