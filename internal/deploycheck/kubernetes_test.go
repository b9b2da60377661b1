package deploycheck

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/internal/replica"
)

// k8sObject holds the fields of the manifests in deploy/kubernetes that the
// tests check.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	// Kustomization
	Resources []string `yaml:"resources"`
	// Secret
	StringData map[string]string `yaml:"stringData"`
	Data       map[string]string `yaml:"data"`
	Spec       struct {
		// Deployment
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
		// PodDisruptionBudget
		MinAvailable   *int `yaml:"minAvailable"`
		MaxUnavailable *int `yaml:"maxUnavailable"`
		// Service: its selector is a plain map, decoded separately.
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
		} `yaml:"securityContext"`
		Affinity struct {
			PodAntiAffinity struct {
				Preferred []struct {
					PodAffinityTerm struct {
						TopologyKey   string        `yaml:"topologyKey"`
						LabelSelector labelSelector `yaml:"labelSelector"`
					} `yaml:"podAffinityTerm"`
				} `yaml:"preferredDuringSchedulingIgnoredDuringExecution"`
			} `yaml:"podAntiAffinity"`
		} `yaml:"affinity"`
		Containers []container `yaml:"containers"`
		Volumes    []struct {
			Name   string `yaml:"name"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
				Items      []struct {
					Key  string `yaml:"key"`
					Path string `yaml:"path"`
				} `yaml:"items"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// manifests decodes every document of every YAML file in deploy/kubernetes,
// by file name.
func manifests(t *testing.T) map[string][]k8sObject {
	t.Helper()
	dir := filepath.Join(root(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	out := map[string][]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", filepath.Base(f), err)
			}
			if o.Kind == "" || o.APIVersion == "" {
				t.Errorf("%s: a document without kind or apiVersion", filepath.Base(f))
			}
			if o.Metadata.Namespace != "" {
				t.Errorf("%s: %s %s sets a namespace; the manifests are namespace-less", filepath.Base(f), o.Kind, o.Metadata.Name)
			}
			out[filepath.Base(f)] = append(out[filepath.Base(f)], o)
		}
	}
	return out
}

// one returns the single object of kind in file.
func one(t *testing.T, all map[string][]k8sObject, file, kind string) k8sObject {
	t.Helper()
	var found []k8sObject
	for _, o := range all[file] {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one %s, found %d", file, kind, len(found))
	}
	return found[0]
}

var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)`)

// binaryFlags is every flag `cronstream <args> --help` lists, its own and
// the global ones.
func binaryFlags(t *testing.T, args ...string) map[string]bool {
	t.Helper()
	cmd := exec.Command(cronstreamBinary(t), append(args, "--help")...)
	cmd.Env = cronstreamEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cronstream %s --help: %v", strings.Join(args, " "), err)
	}
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["nats"] || !flags["help"] {
		t.Fatalf("cronstream %s --help lists no --nats or --help; did its format change?\n%s", strings.Join(args, " "), out)
	}
	return flags
}

// checkArgs checks that every --flag in args is one the command has, and
// returns the flags' values.
func checkArgs(t *testing.T, what string, args []string, known map[string]bool) map[string]string {
	t.Helper()
	values := map[string]string{}
	for i, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			continue
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !known[name] {
			t.Errorf("%s: flag --%s is not a flag of the binary", what, name)
		}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			value = args[i+1]
		}
		values[name] = value
	}
	return values
}

// checkEnv checks that every variable is CRONSTREAM_<FLAG> of a flag the
// command has, and that secret references name a key of the example Secret.
func checkEnv(t *testing.T, what string, c container, known map[string]bool, secret k8sObject) map[string]bool {
	t.Helper()
	set := map[string]bool{}
	for _, e := range c.Env {
		flag, ok := strings.CutPrefix(e.Name, "CRONSTREAM_")
		if !ok || !known[strings.ToLower(strings.ReplaceAll(flag, "_", "-"))] {
			t.Errorf("%s: env %s is not a CRONSTREAM_<FLAG> variable of the binary", what, e.Name)
		}
		set[e.Name] = true
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			if _, ok := secret.StringData[ref.Key]; ref.Name != secret.Metadata.Name || !ok {
				t.Errorf("%s: env %s reads secret %s key %q, which secret.example.yaml does not have", what, e.Name, ref.Name, ref.Key)
			}
		}
	}
	return set
}

// checkSecretFiles checks that each file flag points into a mounted Secret
// volume at a path the volume's items create from keys the example Secret
// has.
func checkSecretFiles(t *testing.T, what string, pod podTemplate, c container, values map[string]string, secret k8sObject, fileFlags ...string) {
	t.Helper()
	for _, flag := range fileFlags {
		path := values[flag]
		if path == "" {
			t.Errorf("%s: no --%s", what, flag)
			continue
		}
		found := false
		for _, m := range c.VolumeMounts {
			rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
			if !ok {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != secret.Metadata.Name {
					continue
				}
				for _, it := range v.Secret.Items {
					if _, ok := secret.StringData[it.Key]; it.Path == rel && ok {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: --%s %s is not a file of a mounted volume of Secret %s", what, flag, path, secret.Metadata.Name)
		}
	}
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetesManifests(t *testing.T) {
	all := manifests(t)
	kust := one(t, all, "kustomization.yaml", "Kustomization")
	for f := range all {
		listed := slices.Contains(kust.Resources, f)
		switch {
		case f == "kustomization.yaml":
		case f == "secret.example.yaml" && listed:
			t.Error("kustomization.yaml applies secret.example.yaml: its placeholders would replace the real Secret")
		case f != "secret.example.yaml" && !listed:
			t.Errorf("kustomization.yaml does not list %s", f)
		}
	}
	for _, r := range kust.Resources {
		if _, ok := all[r]; !ok {
			t.Errorf("kustomization.yaml lists %s, which does not exist", r)
		}
	}

	secret := one(t, all, "secret.example.yaml", "Secret")
	for k, v := range secret.StringData {
		// Placeholders only: URLs without a password, files to replace.
		for part := range strings.SplitSeq(v, ",") {
			if u, err := url.Parse(part); err == nil && u.User != nil {
				if _, ok := u.User.Password(); ok {
					t.Errorf("secret.example.yaml: %s holds a URL with a password", k)
				}
			}
		}
		if !strings.Contains(v, "://") && !strings.HasPrefix(v, "REPLACE-") {
			t.Errorf("secret.example.yaml: %s = %q is not a REPLACE-... placeholder", k, v)
		}
	}
	if len(secret.Data) != 0 {
		t.Error("secret.example.yaml: use stringData placeholders, not data")
	}

	runFlags := binaryFlags(t, "run")
	dep := one(t, all, "deployment.yaml", "Deployment")
	pod := dep.Spec.Template
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("deployment: replicas %v, want 3", dep.Spec.Replicas)
	}
	if !matches(dep.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("deployment: selector %v does not match the pod labels %v", dep.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("deployment: want one container, got %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("deployment: args %v do not run a replica", c.Args)
	}
	values := checkArgs(t, "deployment", c.Args[1:], runFlags)
	if values["replicas"] != "3" {
		t.Errorf("deployment: --replicas %q, want 3 (R3 streams)", values["replicas"])
	}
	_, httpPort, ok := strings.Cut(values["http"], ":")
	if !ok {
		t.Fatalf("deployment: --http %q has no port", values["http"])
	}
	portByName := map[string]int{}
	for _, p := range c.Ports {
		portByName[p.Name] = p.ContainerPort
	}
	if strconv.Itoa(portByName["http"]) != httpPort {
		t.Errorf("deployment: container port \"http\" is %d, --http listens on %s", portByName["http"], httpPort)
	}
	if pod.Metadata.Annotations["prometheus.io/port"] != httpPort || pod.Metadata.Annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("deployment: scrape annotations %v do not point at --http's /metrics", pod.Metadata.Annotations)
	}
	for _, p := range []struct {
		name string
		pr   *probe
		path string
	}{{"startupProbe", c.StartupProbe, "/healthz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.pr == nil || p.pr.HTTPGet == nil {
			t.Errorf("deployment: no HTTP %s", p.name)
			continue
		}
		if p.pr.HTTPGet.Path != p.path {
			t.Errorf("deployment: %s probes %s, want %s", p.name, p.pr.HTTPGet.Path, p.path)
		}
		if _, ok := portByName[p.pr.HTTPGet.Port]; !ok {
			t.Errorf("deployment: %s probes port %q, not a named container port", p.name, p.pr.HTTPGet.Port)
		}
	}
	env := checkEnv(t, "deployment", c, runFlags, secret)
	for _, want := range []string{"CRONSTREAM_NATS", "CRONSTREAM_REDIS", "CRONSTREAM_REPLICA_ID"} {
		if !env[want] {
			t.Errorf("deployment: %s is not set", want)
		}
	}
	checkSecretFiles(t, "deployment", pod, c, values, secret, "redis-password-file", "nats-creds")
	if !pod.Spec.SecurityContext.RunAsNonRoot || !c.SecurityContext.ReadOnlyRootFilesystem ||
		c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Error("deployment: must run as non-root, with a read-only root filesystem and no privilege escalation")
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("deployment: resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	preStop := 0
	if s := c.Lifecycle.PreStop.Sleep; s != nil {
		preStop = s.Seconds
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < time.Duration(preStop)*time.Second+replica.DefaultShutdownTimeout {
		t.Errorf("deployment: terminationGracePeriodSeconds (%s) does not cover the preStop sleep (%ds) plus the %s drain", graceText(g), preStop, replica.DefaultShutdownTimeout)
	}
	anti := pod.Spec.Affinity.PodAntiAffinity.Preferred
	if len(anti) == 0 || anti[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" || !matches(anti[0].PodAffinityTerm.LabelSelector.MatchLabels, pod.Metadata.Labels) {
		t.Error("deployment: no anti-affinity spreading the replicas across nodes")
	}

	pdb := one(t, all, "pdb.yaml", "PodDisruptionBudget")
	if !matches(pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("pdb: selector %v does not match the deployment's pods %v", pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	switch {
	case pdb.Spec.MaxUnavailable != nil && *pdb.Spec.MaxUnavailable == 1 && pdb.Spec.MinAvailable == nil:
	case pdb.Spec.MinAvailable != nil && *pdb.Spec.MinAvailable == *dep.Spec.Replicas-1 && pdb.Spec.MaxUnavailable == nil:
	default:
		t.Errorf("pdb: want maxUnavailable 1 or minAvailable %d", *dep.Spec.Replicas-1)
	}

	svc := serviceSelector(t)
	if !matches(svc, pod.Metadata.Labels) {
		t.Errorf("service: selector %v does not match the deployment's pods", svc)
	}
	svcObj := one(t, all, "service.yaml", "Service")
	if len(svcObj.Spec.Ports) != 1 || portByName[svcObj.Spec.Ports[0].TargetPort] == 0 ||
		strconv.Itoa(svcObj.Spec.Ports[0].Port) != httpPort {
		t.Errorf("service: ports %+v should expose the container's named metrics port", svcObj.Spec.Ports)
	}

	job := one(t, all, "streams-apply-job.yaml", "Job")
	if len(job.Spec.Template.Spec.Containers) != 1 {
		t.Fatal("streams apply job: want one container")
	}
	jc := job.Spec.Template.Spec.Containers[0]
	if len(jc.Args) < 2 || jc.Args[0] != "streams" || jc.Args[1] != "apply" {
		t.Fatalf("streams apply job: args %v", jc.Args)
	}
	applyFlags := binaryFlags(t, "streams", "apply")
	jv := checkArgs(t, "streams apply job", jc.Args[2:], applyFlags)
	if jv["replicas"] != values["replicas"] {
		t.Errorf("streams apply job: --replicas %q, the replicas run with %q", jv["replicas"], values["replicas"])
	}
	if !checkEnv(t, "streams apply job", jc, applyFlags, secret)["CRONSTREAM_NATS"] {
		t.Error("streams apply job: CRONSTREAM_NATS is not set")
	}
	checkSecretFiles(t, "streams apply job", job.Spec.Template, jc, jv, secret, "nats-creds")
	if jc.Image != c.Image {
		t.Errorf("streams apply job: image %q, the deployment runs %q", jc.Image, c.Image)
	}
}

// serviceSelector decodes service.yaml's spec.selector, a plain label map.
func serviceSelector(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "deploy", "kubernetes", "service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Spec struct {
			Selector map[string]string `yaml:"selector"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.Spec.Selector
}

func graceText(g *int) string {
	if g == nil {
		return "not set: 30s"
	}
	return strconv.Itoa(*g) + "s"
}
