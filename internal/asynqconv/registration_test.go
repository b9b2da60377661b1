package asynqconv

import (
	"strings"
	"testing"

	"github.com/cronstream/cronstream/contract"
)

func TestEntryID(t *testing.T) {
	base := Registration{Spec: "0 9 * * *", Type: "report:daily", Payload: []byte(`{"team":"ops"}`), Options: []string{`Queue("reports")`, `MaxRetry(5)`}}
	id := mustID(t, base)
	// Pinned: an id that changed would register every entry of every
	// program again under a new id, and an import would stop matching.
	if id != "report-daily-52723bcfdb80cca5" {
		t.Fatalf("id %q, want report-daily-52723bcfdb80cca5", id)
	}
	if err := contract.ValidateID(id); err != nil {
		t.Fatal(err)
	}
	same := []Registration{
		{Spec: " 0 9 * * * ", Type: base.Type, Payload: base.Payload, Options: []string{`Queue("reports")`, `MaxRetry(5)`}},
		{Spec: base.Spec, Type: base.Type, Payload: base.Payload, Options: []string{`MaxRetry(5)`, `Queue("reports")`}},
		{Spec: base.Spec, Type: base.Type, Payload: base.Payload, Options: []string{`Queue("x")`, `Queue("reports")`, `MaxRetry(5)`, `Timeout(30m0s)`}},
	}
	for i, r := range same {
		if got := mustID(t, r); got != id {
			t.Errorf("same registration %d: id %q, want %q", i, got, id)
		}
	}
	other := []Registration{
		{Spec: "0 10 * * *", Type: base.Type, Payload: base.Payload, Options: base.Options},
		{Spec: base.Spec, Type: "report:weekly", Payload: base.Payload, Options: base.Options},
		{Spec: base.Spec, Type: base.Type, Payload: []byte(`{"team":"dev"}`), Options: base.Options},
		{Spec: base.Spec, Type: base.Type, Payload: base.Payload, Options: []string{`Queue("reports")`}},
		{Spec: base.Spec, Type: base.Type, Payload: base.Payload, Options: []string{`Queue("reports")`, `MaxRetry(5)`, DeadlineName + "(1h0m0s)"}},
		{Spec: base.Spec, Type: base.Type, Payload: base.Payload, Options: base.Options, Headers: map[string]string{"a": "b"}},
	}
	seen := map[string]int{}
	for i, r := range other {
		got := mustID(t, r)
		if got == id {
			t.Errorf("different registration %d has the same id %q", i, id)
		}
		if j, dup := seen[got]; dup {
			t.Errorf("registrations %d and %d share id %q", i, j, got)
		}
		seen[got] = i
	}
	// Field boundaries are part of the hash: moving bytes from the type to
	// the payload makes another id.
	a := mustID(t, Registration{Spec: "@daily", Type: "ab", Payload: []byte("c")})
	b := mustID(t, Registration{Spec: "@daily", Type: "a", Payload: []byte("bc")})
	if strings.TrimPrefix(a, "ab-") == strings.TrimPrefix(b, "a-") {
		t.Errorf("field boundaries not hashed: %s %s", a, b)
	}
}

func mustID(t *testing.T, r Registration) string {
	t.Helper()
	e, err := r.Entry()
	if err != nil {
		t.Fatal(err)
	}
	return e.ID
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"report:daily":           "report-daily",
		"Email::Welcome--Series": "email-welcome-series",
		"::":                     "asynq",
		"日本語":                    "asynq",
		"a_b.c":                  "a-b-c",
		strings.Repeat("x", 100): strings.Repeat("x", maxSlug),
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
