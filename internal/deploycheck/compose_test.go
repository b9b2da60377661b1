package deploycheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type composeFile struct {
	Services map[string]struct {
		Image       string                   `yaml:"image"`
		Build       *struct{ Target string } `yaml:"build"`
		Command     []string                 `yaml:"command"`
		Environment map[string]string        `yaml:"environment"`
		Volumes     []string                 `yaml:"volumes"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	return c
}

func argAfter(cmd []string, flag string) string {
	for i, a := range cmd {
		if a == flag && i+1 < len(cmd) {
			return cmd[i+1]
		}
	}
	return ""
}

func TestComposeNATSCluster(t *testing.T) {
	c := loadCompose(t)
	nodes := []string{"nats-1", "nats-2", "nats-3"}
	for _, n := range nodes {
		s, ok := c.Services[n]
		if !ok {
			t.Fatalf("service %s missing", n)
		}
		if !strings.HasPrefix(s.Image, "nats:") {
			t.Errorf("%s: image %q is not the official nats image", n, s.Image)
		}
		if !slices.Contains(s.Command, "--jetstream") || argAfter(s.Command, "--store_dir") == "" {
			t.Errorf("%s: JetStream with a store dir is not enabled: %v", n, s.Command)
		}
		if argAfter(s.Command, "--cluster_name") != "cronstream" {
			t.Errorf("%s: cluster name: %v", n, s.Command)
		}
		routes := argAfter(s.Command, "--routes")
		for _, other := range nodes {
			if other != n && !strings.Contains(routes, other+":6222") {
				t.Errorf("%s: no route to %s (%q)", n, other, routes)
			}
		}
		if len(s.Volumes) == 0 || s.Healthcheck == nil {
			t.Errorf("%s: needs a volume for its store and a health check", n)
		}
	}
}

func TestComposeRedisIsDurable(t *testing.T) {
	s, ok := loadCompose(t).Services["redis"]
	if !ok {
		t.Fatal("service redis missing")
	}
	if !strings.HasPrefix(s.Image, "redis:") {
		t.Errorf("redis image %q", s.Image)
	}
	if argAfter(s.Command, "--appendonly") != "yes" || argAfter(s.Command, "--maxmemory-policy") != "noeviction" {
		t.Errorf("redis must run with AOF and noeviction (asynq and exactly-once depend on it): %v", s.Command)
	}
	if len(s.Volumes) == 0 || s.Healthcheck == nil {
		t.Error("redis needs a volume and a health check")
	}
}

func TestComposeReplicas(t *testing.T) {
	c := loadCompose(t)
	ids := map[string]bool{}
	for _, n := range []string{"cronstream-1", "cronstream-2", "cronstream-3"} {
		s, ok := c.Services[n]
		if !ok {
			t.Fatalf("service %s missing", n)
		}
		if len(s.Command) == 0 || s.Command[0] != "run" {
			t.Errorf("%s: command %v does not run a replica", n, s.Command)
		}
		if argAfter(s.Command, "--replicas") != "3" {
			t.Errorf("%s: streams must be R3 in this deployment: %v", n, s.Command)
		}
		id := argAfter(s.Command, "--replica-id")
		if id == "" || ids[id] {
			t.Errorf("%s: replica id %q missing or repeated", n, id)
		}
		ids[id] = true
		if s.Build == nil || s.Build.Target != "cronstream" {
			t.Errorf("%s: must build the Dockerfile's cronstream stage", n)
		}
		nats := s.Environment["CRONSTREAM_NATS"]
		for _, node := range []string{"nats-1", "nats-2", "nats-3"} {
			if !strings.Contains(nats, node) {
				t.Errorf("%s: CRONSTREAM_NATS %q lacks %s", n, nats, node)
			}
		}
		if s.Environment["CRONSTREAM_REDIS"] == "" {
			t.Errorf("%s: no CRONSTREAM_REDIS", n)
		}
		if s.Healthcheck == nil || !strings.Contains(strings.Join(s.Healthcheck.Test, " "), "/readyz") {
			t.Errorf("%s: health check must probe /readyz", n)
		}
		if s.DependsOn["redis"].Condition != "service_healthy" {
			t.Errorf("%s: must wait for a healthy redis", n)
		}
	}
}

func TestComposeSyncAndWorker(t *testing.T) {
	c := loadCompose(t)
	sync, ok := c.Services["sync"]
	if !ok || len(sync.Command) == 0 || sync.Command[0] != "sync" || argAfter(sync.Command, "-f") == "" {
		t.Fatalf("sync service must run `cronstream sync -f FILE`: %+v", sync.Command)
	}
	mounted := false
	for _, v := range sync.Volumes {
		if strings.HasPrefix(v, "./examples/schedules.yaml:") && strings.Contains(v, argAfter(sync.Command, "-f")) {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("sync service does not mount examples/schedules.yaml at %s: %v", argAfter(sync.Command, "-f"), sync.Volumes)
	}
	w, ok := c.Services["worker"]
	if !ok || w.Build == nil || w.Build.Target != "example-worker" {
		t.Fatalf("worker service must build the example-worker stage")
	}
	for _, v := range []string{"nats-1", "nats-2", "nats-3", "redis"} {
		if _, ok := c.Volumes[v]; !ok {
			t.Errorf("named volume %s not declared", v)
		}
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		"AS build", "CGO_ENABLED=0", "AS cronstream", "USER nonroot", "HEALTHCHECK", "healthcheck",
		`ENTRYPOINT ["/usr/local/bin/cronstream"]`, `CMD ["run"]`, "AS example-worker", "./examples/worker",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

// TestComposeConfig asks docker compose itself when it is installed (it
// needs no engine for `config`).
func TestComposeConfig(t *testing.T) {
	if exec.Command("docker", "compose", "version").Run() != nil {
		t.Log("docker compose not installed; the structural checks above stand in for it")
		return
	}
	cmd := exec.Command("docker", "compose", "-f", filepath.Join(root(t), "docker-compose.yml"), "config", "--quiet")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker compose config: %v\n%s", err, out)
	}
}

// TestComposeNATSPermissions: every NATS node loads the repository's
// permissions file (the one cmd/cronstream's TestNATSPermissions loads into
// an embedded server), the streams are created by `streams apply` before
// any replica starts, and each service connects as its role: each replica
// as the user of its --replica-id, which may write only that heartbeat.
func TestComposeNATSPermissions(t *testing.T) {
	c := loadCompose(t)
	const file = "deploy/nats/permissions.conf"
	if _, err := os.Stat(filepath.Join(root(t), file)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nats-1", "nats-2", "nats-3"} {
		s := c.Services[n]
		conf := argAfter(s.Command, "--config")
		if conf == "" || !slices.Contains(s.Volumes, "./"+file+":"+conf+":ro") {
			t.Errorf("%s: does not load %s (--config %q, volumes %v)", n, file, conf, s.Volumes)
		}
		for _, v := range []string{"CRONSTREAM_STREAMS_NATS_PASSWORD", "CRONSTREAM_REPLICA_NATS_PASSWORD", "CRONSTREAM_OPERATOR_NATS_PASSWORD", "CRONSTREAM_AUDITOR_NATS_PASSWORD",
			"CRONSTREAM_REPLICA_1_NATS_PASSWORD", "CRONSTREAM_REPLICA_2_NATS_PASSWORD", "CRONSTREAM_REPLICA_3_NATS_PASSWORD"} {
			if s.Environment[v] == "" {
				t.Errorf("%s: no %s for the permissions file", n, v)
			}
		}
	}
	user := func(service, name string) {
		t.Helper()
		urls := strings.Split(c.Services[service].Environment["CRONSTREAM_NATS"], ",")
		for _, u := range urls {
			if !strings.HasPrefix(u, "nats://"+name+":") {
				t.Errorf("%s: NATS URL %q does not connect as %s", service, u, name)
			}
		}
		if len(urls) != 3 {
			t.Errorf("%s: %d NATS URLs, want the 3 nodes", service, len(urls))
		}
	}
	st, ok := c.Services["streams"]
	if !ok || len(st.Command) < 2 || st.Command[0] != "streams" || st.Command[1] != "apply" || argAfter(st.Command, "--replicas") != "3" {
		t.Fatalf("streams service must run `cronstream streams apply --replicas 3`: %v", st.Command)
	}
	user("streams", "cronstream-streams")
	for _, n := range []string{"cronstream-1", "cronstream-2", "cronstream-3"} {
		if c.Services[n].DependsOn["streams"].Condition != "service_completed_successfully" {
			t.Errorf("%s: must start after the streams service completed", n)
		}
		user(n, argAfter(c.Services[n].Command, "--replica-id"))
		if argAfter(c.Services[n].Command, "--replica-id") != n {
			t.Errorf("%s: --replica-id %q, want the name of its NATS user", n, argAfter(c.Services[n].Command, "--replica-id"))
		}
	}
	user("sync", "cronstream-operator")
}

// TestComposeMatchesTests holds the deployment to what the tests prove: the
// NATS image is the nats-server version go.mod embeds in the tests, images
// carry exact versions, Redis syncs every write, and the build context
// leaves out the repository's history and local files.
func TestComposeMatchesTests(t *testing.T) {
	gomod, err := os.ReadFile(filepath.Join(root(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var serverVersion string
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/nats-io/nats-server/v2" {
			serverVersion = strings.TrimPrefix(f[1], "v")
		}
	}
	if serverVersion == "" {
		t.Fatal("go.mod names no nats-server version")
	}
	c := loadCompose(t)
	for _, n := range []string{"nats-1", "nats-2", "nats-3"} {
		if want := "nats:" + serverVersion + "-alpine"; c.Services[n].Image != want {
			t.Errorf("%s: image %q, want %q (the version the tests embed)", n, c.Services[n].Image, want)
		}
	}
	if img := c.Services["redis"].Image; strings.Count(strings.TrimPrefix(strings.SplitN(img, "-", 2)[0], "redis:"), ".") != 2 {
		t.Errorf("redis image %q is not pinned to an exact version", img)
	}
	if got := argAfter(c.Services["redis"].Command, "--appendfsync"); got != "always" {
		t.Errorf("redis --appendfsync %q: acknowledged writes must be on disk (always)", got)
	}
	df, err := os.ReadFile(filepath.Join(root(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(df), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "FROM" && strings.HasPrefix(f[1], "golang:") {
			if v := strings.SplitN(strings.TrimPrefix(f[1], "golang:"), "-", 2)[0]; strings.Count(v, ".") != 2 {
				t.Errorf("Dockerfile: Go image %q is not pinned to an exact version", f[1])
			}
		}
	}
	ignore, err := os.ReadFile(filepath.Join(root(t), ".dockerignore"))
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	for _, want := range []string{".git", "bin"} {
		if !slices.Contains(strings.Split(string(ignore), "\n"), want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
}
