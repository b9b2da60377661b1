package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"rediss://:S3CRET@redis:6380", "rediss://:xxxxx@redis:6380"},
		{"redis://user:S3CRET@redis:6379/2?dial_timeout=3s", "redis://user:xxxxx@redis:6379/2?dial_timeout=3s"},
		{"redis://user@redis:6379", "redis://user@redis:6379"},
		{"nats://a:S3CRET@n1:4222,nats://b:OTHER@n2:4222", "nats://a:xxxxx@n1:4222,nats://b:xxxxx@n2:4222"},
		{"redis://:S3CRET@n1:6379?addr=n2:6379&addr=n3:6379", "redis://:xxxxx@n1:6379?addr=n2%3A6379&addr=n3%3A6379"},
		{"redis-sentinel://s1:26379?sentinel_password=S3CRET", "redis-sentinel://s1:26379?sentinel_password=xxxxx"},
		{"redis://:S3CRET@h:bad", "redis://" + unparsable},
		{"redis://:S3/CRET@h:6379", "redis://" + unparsable},
		{"u:S3CRET@h:6379", "u:xxxxx@h:6379"},
		{"%%:S3CRET@", unparsable},
	} {
		got := URL(c.in)
		if got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "S3") || strings.Contains(got, "OTHER") {
			t.Errorf("URL(%q) = %q shows a secret", c.in, got)
		}
	}
}

func TestScrubber(t *testing.T) {
	var s Scrubber
	s.AddURL("nats://u:S3CRET@127.0.0.1:bad,nats://v:P%40SS@h:1")
	s.AddURL("redis://:S3/CRET@h:6379")
	s.AddSecret("FROMFILE")
	_, parseErr := url.Parse("nats://u:S3CRET@127.0.0.1:bad")
	base := errors.New("base")
	err := fmt.Errorf("connect: %w; also %w; pw FROMFILE, P@SS, S3/CRET, %s", parseErr, base, url.QueryEscape("FROMFILE"))
	got := s.Error(err)
	for _, secret := range []string{"S3CRET", "FROMFILE", "P@SS", "P%40SS", "S3/CRET"} {
		if strings.Contains(got.Error(), secret) {
			t.Errorf("scrubbed error still holds %q: %s", secret, got)
		}
	}
	if !errors.Is(got, base) {
		t.Error("scrubbed error lost its chain")
	}
	var ue *url.Error
	if !errors.As(got, &ue) {
		t.Error("scrubbed error lost the *url.Error")
	}

	var buf bytes.Buffer
	log := slog.New(s.Handler(slog.NewTextHandler(&buf, nil))).With("url", "nats://u:S3CRET@127.0.0.1:bad")
	log.Warn("retry S3CRET", "err", err, slog.Group("g", "pw", "FROMFILE"))
	if out := buf.String(); strings.Contains(out, "S3CRET") || strings.Contains(out, "FROMFILE") {
		t.Errorf("log line holds a secret: %s", out)
	}
	_, perr := url.Parse("redis://:S3CRET/x@h:6379")
	if got := ParseError(perr).Error(); strings.Contains(got, "S3CRET") || !strings.Contains(got, "invalid port") {
		t.Errorf("ParseError: %s", got)
	}
	var zero Scrubber
	if zero.String("keep") != "keep" || zero.Error(base) != base {
		t.Error("the zero Scrubber changes text")
	}
}

type panicky struct{}

func (panicky) String() string { panic("boom") }

// TestHandlerSurvivesPanickyValues: a nil pointer whose Error or String
// method does not guard against nil, or a String that panics, is printed
// as slog prints it; the log line is written and nothing panics.
func TestHandlerSurvivesPanickyValues(t *testing.T) {
	var buf bytes.Buffer
	var s Scrubber
	log := slog.New(s.Handler(slog.NewTextHandler(&buf, nil)))
	var u *url.URL
	var perr *url.Error
	log.Warn("values", "url", u, "err", perr, "odd", panicky{})
	out := buf.String()
	for _, want := range []string{"url=<nil>", "err=<nil>", `odd="!PANIC: boom"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %s:\n%s", want, out)
		}
	}
}
