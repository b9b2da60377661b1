package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/redact"
)

// connFlags are the connection flags of commands that talk to NATS or
// Redis beyond the global --nats/--redis/--prefix.
type connFlags struct {
	natsTLSCert, natsTLSKey, natsTLSCA string
	redisUser, redisPassword           string
	redisPasswordFile                  string
	redisCluster                       bool
	redisSentinelMaster                string
	redisTLSCA, redisTLSCert           string
	redisTLSKey                        string
	redisTLSInsecure                   bool
	// warn receives what is allowed but unsafe (default: a line on
	// stderr; run sends it to its logger).
	warn func(msg string)
	// reconnectForever: a long-running command (a follow, a watch) keeps
	// reconnecting to NATS for as long as it runs, instead of giving up
	// after the client's default number of attempts.
	reconnectForever bool
}

func (c *connFlags) addNATS(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.natsTLSCert, "nats-tls-cert", "", "client certificate for NATS TLS")
	f.StringVar(&c.natsTLSKey, "nats-tls-key", "", "client key for NATS TLS")
	f.StringVar(&c.natsTLSCA, "nats-tls-ca", "", "CA certificate to verify the NATS servers")
}

func (c *connFlags) addRedis(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.redisUser, "redis-username", "", "Redis ACL user (overrides the URL's)")
	f.StringVar(&c.redisPassword, "redis-password", "", "Redis password (overrides the URL's; visible in the process list: prefer --redis-password-file)")
	f.StringVar(&c.redisPasswordFile, "redis-password-file", "", "read the Redis password from this file (overrides the URL's): keeps it out of the process list")
	f.BoolVar(&c.redisCluster, "redis-cluster", false, "Redis is a cluster: --redis is one node's URL, more nodes as ?addr=host:port")
	f.StringVar(&c.redisSentinelMaster, "redis-sentinel-master", "", "use Redis Sentinel with this master name: --redis is a sentinel's URL, more as ?addr=host:port")
	f.StringVar(&c.redisTLSCA, "redis-tls-ca", "", "CA certificates (PEM) that sign the Redis servers' certificates; turns TLS on")
	f.StringVar(&c.redisTLSCert, "redis-tls-cert", "", "client certificate (PEM) for Redis TLS, with --redis-tls-key (Redis's tls-auth-clients); turns TLS on")
	f.StringVar(&c.redisTLSKey, "redis-tls-key", "", "private key (PEM) of --redis-tls-cert")
	f.BoolVar(&c.redisTLSInsecure, "redis-tls-insecure-skip-verify", false, "do not verify the Redis server's certificate (anyone on the path can read and change the traffic; for tests only); turns TLS on")
}

// redisTLS returns the TLS configuration of the Redis connections: nil for
// plain TCP. Any --redis-tls-* flag turns TLS on whatever the URL's
// scheme, so a cluster or sentinel address list needs no rediss:// on
// each; a rediss:// URL alone verifies the server against the system's
// CAs. The server name checked is each address's host.
func (c *connFlags) redisTLS(scheme string) (*tls.Config, error) {
	if scheme != "rediss" && c.redisTLSCA == "" && c.redisTLSCert == "" && c.redisTLSKey == "" && !c.redisTLSInsecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.redisTLSCA != "" {
		pem, err := os.ReadFile(c.redisTLSCA)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-tls-ca %s: no PEM certificate in the file", c.redisTLSCA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case c.redisTLSCert != "" && c.redisTLSKey != "":
		// Its errors name what is wrong (no PEM data, a key that does not
		// match) and never quote the key.
		cert, err := tls.LoadX509KeyPair(c.redisTLSCert, c.redisTLSKey)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-cert %s, --redis-tls-key %s: %w", c.redisTLSCert, c.redisTLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case c.redisTLSCert != "" || c.redisTLSKey != "":
		return nil, errors.New("--redis-tls-cert and --redis-tls-key: give both (the client certificate and its key)")
	}
	if c.redisTLSInsecure {
		if c.redisTLSCA != "" {
			return nil, errors.New("--redis-tls-ca and --redis-tls-insecure-skip-verify: give one")
		}
		cfg.InsecureSkipVerify = true
		c.warnf("--redis-tls-insecure-skip-verify: the Redis server's certificate is not verified; anyone on the network path can impersonate it (use --redis-tls-ca)")
	}
	return cfg, nil
}

func (c *connFlags) warnf(msg string) {
	if c.warn != nil {
		c.warn(msg)
		return
	}
	fmt.Fprintln(os.Stderr, "cronstream: warning:", msg)
}

// natsOptions turns the flags into connection options.
func (c *connFlags) natsOptions(g *globalFlags) []nats.Option {
	var opts []nats.Option
	if g.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(g.natsCreds))
	}
	if c.natsTLSCert != "" || c.natsTLSKey != "" {
		opts = append(opts, nats.ClientCert(c.natsTLSCert, c.natsTLSKey))
	}
	if c.natsTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.natsTLSCA))
	}
	if c.reconnectForever {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	}
	return opts
}

// connectNATS connects for a one-shot command: fail fast with a clear
// message rather than wait forever.
func connectNATS(g *globalFlags, c *connFlags) (*nats.Conn, jetstream.JetStream, error) {
	opts := append([]nats.Option{nats.Name("cronstream cli"), nats.Timeout(5 * time.Second)}, c.natsOptions(g)...)
	nc, err := nats.Connect(g.nats, opts...)
	if err != nil {
		hint := "is `cronstream dev` or a NATS server running? set --nats or CRONSTREAM_NATS"
		var ue *url.Error
		switch {
		case isNATSAuthError(err):
			hint = "check the user and password in --nats, or --nats-creds"
		case errors.As(err, &ue) && ue.Op == "parse":
			hint = "check the URL in --nats or CRONSTREAM_NATS"
		}
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w (%s)", redact.URL(g.nats), g.secrets.Error(redact.ParseError(err)), hint)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// openRedis builds the Redis client: a single node (redis:// or rediss://),
// a cluster (--redis-cluster) or Sentinel (--redis-sentinel-master).
func openRedis(g *globalFlags, c *connFlags) (redis.UniversalClient, error) {
	raw := g.redis
	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	shown := redact.URL(g.redis)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("--redis %s: %w", shown, redact.ParseError(err))
	}
	password, err := c.password(g)
	if err != nil {
		return nil, err
	}
	if u.Query().Has("skip_verify") {
		return nil, fmt.Errorf("--redis %s: skip_verify in the URL is not honoured: verification is turned off only by --redis-tls-insecure-skip-verify", shown)
	}
	tlsConfig, err := c.redisTLS(u.Scheme)
	if err != nil {
		return nil, err
	}
	switch {
	case c.redisCluster:
		o, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, fmt.Errorf("--redis %s as a cluster URL: %w", shown, g.secrets.Error(err))
		}
		o.Username, o.Password = pick(c.redisUser, o.Username), pick(password, o.Password)
		o.TLSConfig = tlsConfig
		return redis.NewClusterClient(o), nil
	case c.redisSentinelMaster != "":
		q := u.Query()
		q.Set("master_name", c.redisSentinelMaster)
		u.RawQuery = q.Encode()
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("--redis %s as a sentinel URL: %w", shown, g.secrets.Error(err))
		}
		o.Username, o.Password = pick(c.redisUser, o.Username), pick(password, o.Password)
		o.TLSConfig = tlsConfig
		return redis.NewFailoverClient(o), nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("--redis %s: %w", shown, g.secrets.Error(err))
	}
	o.Username, o.Password = pick(c.redisUser, o.Username), pick(password, o.Password)
	o.TLSConfig = tlsConfig
	return redis.NewClient(o), nil
}

func pick(flag, fromURL string) string {
	if flag != "" {
		return flag
	}
	return fromURL
}

// password is --redis-password or the content of --redis-password-file
// (one trailing newline dropped), "" when neither is given.
func (c *connFlags) password(g *globalFlags) (string, error) {
	if c.redisPasswordFile == "" {
		return c.redisPassword, nil
	}
	if c.redisPassword != "" {
		return "", errors.New("--redis-password and --redis-password-file: give one")
	}
	b, err := os.ReadFile(c.redisPasswordFile)
	if err != nil {
		return "", fmt.Errorf("--redis-password-file: %w", err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return "", fmt.Errorf("--redis-password-file %s is empty", c.redisPasswordFile)
	}
	g.secrets.AddSecret(pw)
	return pw, nil
}

// isNATSAuthError reports whether NATS refused the credentials.
func isNATSAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// names validates --prefix.
func (g *globalFlags) names() (events.Names, error) {
	n, err := events.NewNames(g.prefix)
	if err != nil {
		return events.Names{}, fmt.Errorf("--prefix: %w", err)
	}
	return n, nil
}

// newLogger builds the slog logger from --log-format and --log-level; no
// line it writes carries a secret of g's.
func newLogger(g *globalFlags, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(g.secrets.Handler(slog.NewTextHandler(os.Stderr, opts))), nil
	case "json":
		return slog.New(g.secrets.Handler(slog.NewJSONHandler(os.Stderr, opts))), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}

// pingRedis fails fast with a clear message for one-shot commands.
func pingRedis(ctx context.Context, c redis.UniversalClient, g *globalFlags) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		hint := "set --redis or CRONSTREAM_REDIS"
		switch {
		case redis.IsAuthError(err):
			hint = "check the user and password: --redis, --redis-username, --redis-password-file"
		case redis.IsPermissionError(err):
			hint = "the Redis ACL user lacks a permission cronstream needs"
		default:
			if h := tlsHint(err); h != "" {
				hint = h
			}
		}
		return fmt.Errorf("connect to Redis at %s: %w (%s)", redact.URL(g.redis), g.secrets.Error(err), hint)
	}
	return nil
}

// tlsHint says which flag fixes a failed TLS handshake with Redis, "" when
// err is not one.
func tlsHint(err error) string {
	var verify *tls.CertificateVerificationError
	var rec tls.RecordHeaderError
	var op *net.OpError
	switch {
	case errors.As(err, &verify):
		return "the Redis server's certificate is not trusted: give the CA that signed it with --redis-tls-ca"
	case errors.As(err, &rec):
		return "the Redis server does not speak TLS: use a redis:// URL without --redis-tls-* flags"
	case errors.As(err, &op) && op.Op == "remote error":
		return "the Redis server refused the TLS handshake: it may require a client certificate (--redis-tls-cert, --redis-tls-key) signed by a CA it trusts"
	}
	return ""
}
