package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cronstream/cronstream/internal/testenv"
)

// TestRedisTLS runs the real binary against a redis-server that speaks only
// TLS to it and requires a client certificate (Redis's default
// tls-auth-clients yes), with a throwaway CA.
func TestRedisTLS(t *testing.T) {
	t.Parallel()
	certs := testenv.NewTLSFiles(t)
	rd := testenv.StartRedis(t, testenv.WithTLS(certs.Redis()))
	e := newEnv(t, false)
	e.redis = rd
	e.vars = append(e.vars, "CRONSTREAM_REDIS=rediss://"+rd.TLSAddr)
	ca := []string{"--redis-tls-ca", certs.CAFile}
	client := []string{"--redis-tls-cert", certs.ClientCert, "--redis-tls-key", certs.ClientKey}
	with := func(args []string, flags ...[]string) []string {
		for _, f := range flags {
			args = append(args, f...)
		}
		return args
	}

	e.ok("entry", "put", "tls", "--cron", "@every 1s", "--type", "tls:tick")

	// CA and client certificate: a replica fires through TLS, status reads
	// through TLS.
	p := start(t, append(e.vars, "CRONSTREAM_REDIS_TLS_CA="+certs.CAFile, "CRONSTREAM_REDIS_TLS_CERT="+certs.ClientCert, "CRONSTREAM_REDIS_TLS_KEY="+certs.ClientKey),
		"run", "--http", "127.0.0.1:0", "--log-format", "json", "--replica-id", "tls-replica")
	var addr string
	testenv.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		addr, ok = logValue(p.Stderr(), "serving http", "addr")
		return ok
	}, "run did not log its HTTP address:\n%s", p.Stderr())
	testenv.Eventually(t, 30*time.Second, func() bool { return httpStatus("http://"+addr+"/readyz") == http.StatusOK }, "/readyz never 200 over TLS:\n%s", p.Stderr())
	ins := inspector(t, rd.URL) // the plain port, the test's own view
	testenv.Eventually(t, 30*time.Second, func() bool { return len(pendingTasks(t, ins, "default")) >= 1 }, "no task fired over TLS:\n%s", p.Stderr())
	var st statusJSON
	e.okJSON(&st, with([]string{"status", "--json"}, ca, client)...)
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "tls-replica" {
		t.Errorf("status over TLS: replicas %+v", st.Replicas)
	}
	if code := p.stop(syscall.SIGTERM, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d\n%s", code, p.Stderr())
	}

	// A client certificate is required by the server.
	if msg := e.fail(with([]string{"status"}, ca)...); !strings.Contains(msg, "client certificate") || !strings.Contains(msg, "--redis-tls-cert") {
		t.Errorf("without a client certificate: %s", msg)
	}
	// The server's certificate is signed by a CA the system does not know.
	if msg := e.fail(with([]string{"status"}, client)...); !strings.Contains(msg, "certificate") || !strings.Contains(msg, "--redis-tls-ca") {
		t.Errorf("without the CA: %s", msg)
	}
	// The replica stops at start-up with the reason instead of retrying.
	r := e.run(with([]string{"run", "--http", "", "--replica-id", "no-ca"}, client)...)
	if r.code == 0 || !strings.Contains(r.stderr, "certificate is not trusted") {
		t.Errorf("run without the CA:\n%s", r)
	}
	r = e.run(with([]string{"run", "--http", "", "--replica-id", "no-cert"}, ca)...)
	if r.code == 0 || !strings.Contains(r.stderr, "refused the TLS handshake") {
		t.Errorf("run without a client certificate:\n%s", r)
	}

	// Verification off, only when asked: it works and says it is unsafe.
	r = e.run(with([]string{"status"}, client, []string{"--redis-tls-insecure-skip-verify"})...)
	if r.code != 0 || !strings.Contains(r.stderr, "warning: --redis-tls-insecure-skip-verify") {
		t.Errorf("insecure-skip-verify:\n%s", r)
	}
	// ... and never from the URL.
	if msg := e.fail(with([]string{"status", "--redis", "rediss://" + rd.TLSAddr + "?skip_verify=true"}, client)...); !strings.Contains(msg, "--redis-tls-insecure-skip-verify") {
		t.Errorf("skip_verify in the URL: %s", msg)
	}

	// Bad files: a clear error naming the flag, never the key's content.
	secretKey := writeFile(t, "bad-key.pem", "-----BEGIN PRIVATE KEY-----\nU0VDUkVUS0VZTUFURVJJQUw=\n-----END PRIVATE KEY-----\n")
	notPEM := writeFile(t, "not.pem", "hello")
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"missing CA file", []string{"--redis-tls-ca", "/nonexistent/ca.pem"}, "--redis-tls-ca: open /nonexistent/ca.pem: no such file"},
		{"CA not PEM", []string{"--redis-tls-ca", notPEM}, "no PEM certificate"},
		{"cert without key", []string{"--redis-tls-cert", certs.ClientCert}, "give both"},
		{"bad key", []string{"--redis-tls-cert", certs.ClientCert, "--redis-tls-key", secretKey}, "--redis-tls-key"},
		{"cert not PEM", []string{"--redis-tls-cert", notPEM, "--redis-tls-key", certs.ClientKey}, "--redis-tls-cert"},
		{"CA and insecure", append([]string{"--redis-tls-insecure-skip-verify"}, ca...), "give one"},
	} {
		for _, cmd := range [][]string{{"status"}, {"run", "--http", ""}} {
			r := e.run(append(cmd, tc.flags...)...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s, %s: want an error with %q:\n%s", tc.name, cmd[0], tc.want, r)
			}
			if strings.Contains(r.stderr, "U0VDUkVU") {
				t.Errorf("%s: the key's content is printed:\n%s", tc.name, r)
			}
		}
	}
}
