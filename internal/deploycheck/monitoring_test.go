package deploycheck

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/internal/replica"
	"github.com/cronstream/cronstream/internal/testenv"
)

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadAlertRules(t *testing.T) alertRules {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "deploy", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yaml does not parse as rule groups: %v", err)
	}
	return r
}

type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "deploy", "grafana", "cronstream.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/cronstream.json does not parse: %v", err)
	}
	return d
}

func TestAlertRulesShape(t *testing.T) {
	r := loadAlertRules(t)
	if len(r.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	names := map[string]bool{}
	var exprs []string
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "" || names[rule.Alert] {
				t.Errorf("rule %q: missing or repeated alert name", rule.Alert)
			}
			names[rule.Alert] = true
			if strings.TrimSpace(rule.Expr) == "" {
				t.Errorf("%s: no expr", rule.Alert)
			}
			if s := rule.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", rule.Alert, s)
			}
			if rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", rule.Alert)
			}
			if rule.For != "" {
				if _, err := time.ParseDuration(rule.For); err != nil {
					t.Errorf("%s: for %q: %v", rule.Alert, rule.For, err)
				}
			}
			if !balanced(rule.Expr) {
				t.Errorf("%s: unbalanced brackets in %q", rule.Alert, rule.Expr)
			}
			if rule.Alert == "CronstreamOutboxNearBound" && !strings.Contains(rule.Expr, strconv.Itoa(replica.DefaultMaxOutboxBytes)) {
				t.Errorf("%s: %q does not use the default --max-outbox-bytes (%d)", rule.Alert, rule.Expr, replica.DefaultMaxOutboxBytes)
			}
			exprs = append(exprs, rule.Expr)
		}
	}
	// What the issue and docs/operations.md ask to be alerted on.
	all := strings.Join(exprs, "\n")
	for _, want := range []string{
		"cronstream_late_entries", "cronstream_fire_refused_total", "cronstream_relay_backlog",
		"cronstream_relay_backlog_bytes", "cronstream_scheduler_backpressure", "cronstream_relay_publish_errors_total",
		"cronstream_relay_forgeries_total", "cronstream_relay_dropped_total", "cronstream_auth_errors_total", "cronstream_recover_errors_total",
		"cronstream_fire_lag_seconds_bucket", `absent(up{job="cronstream"}`, "cronstream_quarantined_entries",
		"cronstream_fires_lost_total", "cronstream_fires_lost_unknown_total", "cronstream_relay_redis_wait_behind",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no alert rule uses %s", want)
		}
	}
}

func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard needs a uid, a title and panels: %+v", d)
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !balanced(tg.Expr) {
				t.Errorf("panel %q: unbalanced brackets in %q", p.Title, tg.Expr)
			}
		}
	}
}

// balanced reports whether (), [] and {} nest properly in a PromQL
// expression; the Prometheus parser is not a dependency of this module.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inString := false
	for _, c := range expr {
		switch {
		case c == '"':
			inString = !inString
		case inString:
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case pairs[c] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}

var metricName = regexp.MustCompile(`\bcronstream_[a-z_]+[a-z]\b`)

// histogramSuffixes are the series names a histogram family adds.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// referencedMetrics is every cronstream metric name the alert rules (their
// expressions and annotation queries) and the dashboard queries use, with
// where each is used.
func referencedMetrics(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(where, text string) {
		for _, m := range metricName.FindAllString(text, -1) {
			if _, ok := out[m]; !ok {
				out[m] = where
			}
		}
	}
	for _, g := range loadAlertRules(t).Groups {
		for _, r := range g.Rules {
			add("alert "+r.Alert, r.Expr)
			for _, a := range r.Annotations {
				add("alert "+r.Alert+" annotation", a)
			}
		}
	}
	for _, p := range loadDashboard(t).Panels {
		for _, tg := range p.Targets {
			add("panel "+p.Title, tg.Expr)
		}
	}
	return out
}

// TestMonitoringMetricsExist runs a real replica against real NATS and
// Redis, lets one entry fire, and checks that every metric the alert rules
// and the dashboard query is on its /metrics.
func TestMonitoringMetricsExist(t *testing.T) {
	refs := referencedMetrics(t)
	if len(refs) < 10 {
		t.Fatalf("found only %d metric names in the rules and the dashboard: %v", len(refs), refs)
	}
	bin := cronstreamBinary(t)
	ns := testenv.StartNATS(t)
	rd := testenv.StartRedis(t)
	env := cronstreamEnv("CRONSTREAM_NATS="+ns.URL(), "CRONSTREAM_REDIS="+rd.URL)

	put := exec.Command(bin, "entry", "put", "deploycheck", "--cron", "@every 1s", "--type", "deploycheck:tick", "--queue", "deploycheck")
	put.Env = env
	if out, err := put.CombinedOutput(); err != nil {
		t.Fatalf("entry put: %v\n%s", err, out)
	}

	addr := startReplica(t, bin, env)
	var families map[string]bool
	var last string
	testenv.Eventually(t, 15*time.Second, func() bool {
		families, last = scrapeFamilies(t, "http://"+addr+"/metrics")
		// The entry has fired and its queue been through a recovery pass:
		// the per-queue series exist.
		return strings.Contains(last, `cronstream_fires_total{queue="deploycheck"}`) &&
			strings.Contains(last, `cronstream_recover_pass_seconds_count{queue="deploycheck"}`)
	}, "the replica did not fire the entry and recover its queue; last /metrics:\n%s", lazy(func() string { return last }))

	for name, where := range refs {
		if families[name] {
			continue
		}
		base, found := "", false
		for _, s := range histogramSuffixes {
			if b, ok := strings.CutSuffix(name, s); ok {
				base, found = b, families[b]
			}
		}
		if !found {
			t.Errorf("%s (used by %s) is not on a running replica's /metrics (histogram base %q)", name, where, base)
		}
	}
}

// scrapeFamilies returns the metric families named by HELP or TYPE lines
// on a /metrics page, and the page.
func scrapeFamilies(t *testing.T, url string) (map[string]bool, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err.Error()
	}
	families := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE") {
			families[f[2]] = true
		}
	}
	return families, string(b)
}

// startReplica starts `cronstream run` on a free port and returns its HTTP
// address once it serves; the replica is stopped with SIGTERM at cleanup.
func startReplica(t *testing.T, bin string, env []string) string {
	t.Helper()
	cmd := exec.Command(bin, "run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "deploycheck", "--recover-interval", "200ms")
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		addr string
		logs strings.Builder
	)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving http" {
				addr = line.Addr
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { <-read; done <- cmd.Wait() }()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		select {
		case err := <-done:
			if err != nil {
				mu.Lock()
				t.Errorf("replica exited with %v:\n%s", err, logs.String())
				mu.Unlock()
			}
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			t.Error("replica did not stop within 20s of SIGTERM")
		}
	})
	testenv.Eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return addr != ""
	}, "the replica did not log its HTTP address:\n%s", lazy(func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }))
	mu.Lock()
	defer mu.Unlock()
	return addr
}

// lazy is a message part computed only when a wait fails.
type lazy func() string

func (f lazy) String() string { return f() }
