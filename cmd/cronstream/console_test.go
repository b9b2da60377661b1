package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/testenv"
)

// TestConsoleFlags: dev serves the console by default, run only with
// --console, and --http-token (here from the environment) guards it.
func TestConsoleFlags(t *testing.T) {
	t.Parallel()
	status := func(url, token string) int {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		resp.Body.Close()
		if !strings.HasSuffix(url, "/healthz") && resp.StatusCode == 200 && !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("%s: no Content-Security-Policy", url)
		}
		return resp.StatusCode
	}

	dev, _, _ := startDev(t, t.TempDir())
	line := dev.line("open http://", 10*time.Second)
	url := strings.Fields(strings.TrimSpace(line))[1]
	if code := status(url, ""); code != 200 {
		t.Fatalf("dev console %s: %d", url, code)
	}
	dev.stop(syscall.SIGINT, 20*time.Second)

	e := newEnv(t, true)
	httpOf := func(p *proc) string {
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok
		}, "run did not log its HTTP address")
		base := "http://" + addr
		testenv.Eventually(t, 30*time.Second, func() bool { return status(base+"/healthz", "") == 200 }, "no /healthz")
		return base
	}
	plain := start(t, e.vars, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "plain")
	base := httpOf(plain)
	if code := status(base+"/", ""); code != http.StatusNotFound {
		t.Errorf("run without --console serves /: %d", code)
	}
	plain.stop(syscall.SIGTERM, 20*time.Second)

	guarded := start(t, append(e.vars, "CRONSTREAM_HTTP_TOKEN=tok-123"), "run", "--http", "127.0.0.1:0", "--log-format", "json", "--console", "--replica-id", "guarded")
	base = httpOf(guarded)
	testenv.Eventually(t, 30*time.Second, func() bool { return status(base+"/", "tok-123") == 200 }, "console never served with the token")
	if code := status(base+"/", ""); code != http.StatusUnauthorized {
		t.Errorf("console without the token: %d", code)
	}
	if strings.Contains(guarded.Stdout()+guarded.Stderr(), "tok-123") {
		t.Errorf("the token is in the log:\n%s", guarded.Stderr())
	}
	guarded.stop(syscall.SIGTERM, 20*time.Second)
}

// TestConsoleSessionAcrossReplicas: a session signed in on one replica
// opens the console of every replica given the same token (a load balancer
// may send the next request anywhere) and of none given another token (a
// rotated token ends every session).
func TestConsoleSessionAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	replica := func(id, token string) string {
		p := start(t, append(e.vars, "CRONSTREAM_HTTP_TOKEN="+token), "run", "--http", "127.0.0.1:0", "--log-format", "json", "--console", "--replica-id", id)
		var addr string
		testenv.Eventually(t, 30*time.Second, func() bool {
			var ok bool
			addr, ok = logValue(p.Stderr(), "serving http", "addr")
			return ok
		}, "%s did not log its HTTP address", id)
		return "http://" + addr
	}
	a, b, rotated := replica("a", "tok-shared"), replica("b", "tok-shared"), replica("c", "tok-rotated")
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(base, cookie string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/entries", nil)
		req.Header.Set("Cookie", cookie)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var cookie string
	testenv.Eventually(t, 30*time.Second, func() bool {
		resp, err := noRedirect.PostForm(a+"/login", url.Values{"token": {"tok-shared"}})
		if err != nil {
			return false
		}
		resp.Body.Close()
		for _, c := range resp.Cookies() {
			if c.Name == "cronstream_session" {
				cookie = c.Name + "=" + c.Value
			}
		}
		return cookie != "" && get(a, cookie) == http.StatusOK
	}, "no session from replica a")
	if strings.Contains(cookie, "tok-shared") {
		t.Fatalf("the session cookie holds the token: %s", cookie)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return get(b, cookie) == http.StatusOK }, "replica b does not accept a's session")
	if code := get(rotated, cookie); code != http.StatusUnauthorized {
		t.Errorf("a replica with another token: %d, want 401", code)
	}
}

// TestConsoleOverviewMatchesStatus: with two replicas serving the console
// and entries in every state (active, paused, ended, completed), the
// overview of either replica shows the figures `status --json` prints:
// the entries counted by state, and each replica's config sequence and a
// heartbeat age as recent as status's.
func TestConsoleOverviewMatchesStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	for i := range 3 {
		e.ok("entry", "put", fmt.Sprintf("active-%d", i), "--cron", "@hourly", "--type", "t")
	}
	e.ok("entry", "put", "held", "--cron", "@hourly", "--type", "t")
	e.ok("entry", "pause", "held")
	e.ok("entry", "put", "over", "--cron", "@hourly", "--type", "t", "--end-at", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	e.ok("entry", "put", "once", "--cron", "@every 1s", "--type", "t", "--max-fires", "1")
	_, a := startMetricsReplica(t, e, "a", "--console")
	_, b := startMetricsReplica(t, e, "b", "--console")

	type report struct {
		Replicas []struct {
			ID        string `json:"id"`
			ConfigSeq uint64 `json:"config_seq"`
			BeatAge   string `json:"beat_age"`
		} `json:"replicas"`
		Entries map[string]any `json:"entries"`
		Config  struct {
			LastSeq uint64 `json:"last_seq"`
		} `json:"config_stream"`
	}
	var rep report
	testenv.Eventually(t, 30*time.Second, func() bool {
		e.okJSON(&rep, "status", "--json")
		return len(rep.Replicas) == 2 && rep.Entries["completed"] == 1.0 &&
			rep.Replicas[0].ConfigSeq == rep.Config.LastSeq && rep.Replicas[1].ConfigSeq == rep.Config.LastSeq
	}, "status never showed two caught-up replicas and the completed entry: %+v", rep)
	if want := map[string]float64{"active": 3, "paused": 1, "ended": 1, "completed": 1, "quarantined": 0}; !countsEqual(rep.Entries, want) {
		t.Fatalf("status counts %v, want %v", rep.Entries, want)
	}

	card := regexp.MustCompile(`data-count="(\w+)"><b>([0-9,]+)</b>`)
	row := regexp.MustCompile(`<tr><td>([^<]+)</td><td>[^<]*</td><td>[^<]*</td><td>[^<]*</td><td>([^<]+) ago</td><td>(\d+)</td><td>(\d+)</td>`)
	for _, base := range []string{a, b} {
		resp, err := http.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cards := map[string]any{}
		for _, m := range card.FindAllStringSubmatch(string(body), -1) {
			n, _ := strconv.Atoi(strings.ReplaceAll(m[2], ",", ""))
			cards[m[1]] = float64(n)
		}
		for k, v := range rep.Entries {
			if n, ok := v.(float64); ok && cards[k] != n {
				t.Errorf("%s overview: %s %v, status %v", base, k, cards[k], n)
			}
		}
		rows := row.FindAllStringSubmatch(string(body), -1)
		if len(rows) != len(rep.Replicas) {
			t.Fatalf("%s overview lists %d replicas, status %d:\n%s", base, len(rows), len(rep.Replicas), body)
		}
		for i, r := range rows {
			age, err := time.ParseDuration(r[2])
			if r[1] != rep.Replicas[i].ID || r[3] != strconv.FormatUint(rep.Replicas[i].ConfigSeq, 10) || r[4] != "0" || err != nil || age > 3*replica.DefaultHeartbeat {
				t.Errorf("%s overview row %q: status shows %+v (heartbeats every %s)", base, r[1:], rep.Replicas[i], replica.DefaultHeartbeat)
			}
		}
	}
}

func countsEqual(got map[string]any, want map[string]float64) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
