package replica

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/redact"
)

// ErrUnrecoverable is wrapped by Run's error when waiting cannot help:
// credentials refused, a permission missing, impossible settings. Network
// errors and servers that are down are retried instead.
var ErrUnrecoverable = errors.New("retrying cannot fix this")

// unrecoverable returns the reason err cannot be fixed by retrying (wrapping
// ErrUnrecoverable), or nil when it may be transient. nc, when not nil, is
// asked too: a NATS connection that the server refused keeps the reason in
// LastError while the calls made on it only time out or see it closed.
func unrecoverable(err error, nc *nats.Conn) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Op == "parse" {
		// Not its text: url.Error repeats the URL, password included.
		return fmt.Errorf("%w (invalid URL): %w", ErrUnrecoverable, redact.ParseError(err))
	}
	if cause := unrecoverableCause(err); cause != "" {
		return fmt.Errorf("%w (%s): %w", ErrUnrecoverable, cause, err)
	}
	if nc != nil {
		if last := nc.LastError(); last != nil && !expectedRefusal(last) {
			if cause := unrecoverableCause(last); cause != "" {
				return fmt.Errorf("%w (%s): %w", ErrUnrecoverable, cause, last)
			}
		}
	}
	return nil
}

// expectedRefusal reports whether err is a NATS permissions violation a
// replica meets in its ordinary work under deploy/nats/permissions.conf,
// which stops nothing: creating a missing stream (it then waits for
// `cronstream streams apply`), and deleting a consumer, which the NATS
// client does when it replaces an ordered consumer (the server removes the
// old one after its inactive threshold). No role may delete consumers: it
// could not be limited to its own.
func expectedRefusal(err error) bool {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "$JS.API.CONSUMER.DELETE.") || strings.Contains(msg, "$JS.API.STREAM.CREATE.")
}

// JetStream error codes of stream settings the server will never accept
// as given (nats-server's errors.json).
const (
	jsStreamInvalidConfig        = 10052
	jsStreamSubjectOverlap       = 10065
	jsStreamReplicasNotSupported = 10074
)

func unrecoverableCause(err error) string {
	var apiErr *jetstream.APIError
	var verify *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case errors.As(err, &verify):
		return "the server's TLS certificate is not trusted (CA flag?)"
	case errors.As(err, &op) && op.Op == "remote error":
		// A TLS alert from the server: it refused our certificate, or
		// wants one.
		return "the server refused the TLS handshake (client certificate?)"
	case redis.IsAuthError(err):
		return "Redis refused the credentials"
	case redis.IsPermissionError(err):
		return "the Redis user lacks a permission"
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return "NATS refused the credentials"
	case errors.Is(err, nats.ErrPermissionViolation):
		return "the NATS user lacks a permission"
	case errors.Is(err, events.ErrStreamConflict):
		return "the existing stream conflicts with the settings"
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jsStreamInvalidConfig, jsStreamSubjectOverlap, jsStreamReplicasNotSupported:
			return "JetStream refused the stream settings"
		}
	}
	return ""
}
