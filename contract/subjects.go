package contract

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultPrefix is the subject prefix, and upper-cased the stream prefix,
// when none is configured.
const DefaultPrefix = "cronstream"

// Names derives every subject and stream name from one prefix, so several
// tenants can share a NATS account.
type Names struct {
	prefix string
}

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// NewNames validates prefix (1-64 of [A-Za-z0-9_-]: a subject token and,
// upper-cased, part of a stream name) and returns its names. The empty
// prefix means DefaultPrefix.
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(prefix) {
		return Names{}, fmt.Errorf("prefix %q: must be 1-64 characters of A-Z a-z 0-9 _ -", prefix)
	}
	return Names{prefix: prefix}, nil
}

// MustNames is NewNames for prefixes known to be valid (constants, tests).
func MustNames(prefix string) Names {
	n, err := NewNames(prefix)
	if err != nil {
		panic(err)
	}
	return n
}

// Prefix returns the subject prefix.
func (n Names) Prefix() string {
	if n.prefix == "" {
		return DefaultPrefix
	}
	return n.prefix
}

func (n Names) streamPrefix() string {
	return strings.ToUpper(strings.ReplaceAll(n.Prefix(), "-", "_"))
}

// ConfigStream is the name of the config stream, <P>_CONFIG.
func (n Names) ConfigStream() string { return n.streamPrefix() + "_CONFIG" }

// ActivityStream is the name of the activity stream, <P>_ACTIVITY.
func (n Names) ActivityStream() string { return n.streamPrefix() + "_ACTIVITY" }

// ReplicasBucket is the name of the KV bucket where live replicas keep
// their heartbeat, <P>_REPLICAS.
func (n Names) ReplicasBucket() string { return n.streamPrefix() + "_REPLICAS" }

// replicaIDPattern is NATS KV's rule for a key, which a replica id must
// follow: the client refuses any other key.
var replicaIDPattern = regexp.MustCompile(`^[-/_=.A-Za-z0-9]+$`)

// ValidateReplicaID checks a replica id. It is the key of the replica's
// heartbeat in the replicas bucket (ReplicasBucket), so it follows NATS
// KV's rule for keys: one or more of A-Z a-z 0-9 - _ / = and '.', neither
// starting nor ending with '.' and without "..". It holds no ':' and no
// space, which the ids built of it rely on (the scheduler id a replica
// lists its entries under for asynq's tools).
func ValidateReplicaID(id string) error {
	if !replicaIDPattern.MatchString(id) || strings.HasPrefix(id, ".") || strings.HasSuffix(id, ".") || strings.Contains(id, "..") {
		return fmt.Errorf("replica id %q: must be letters, digits and - _ / = . (a key of the replicas bucket), not starting or ending with '.' nor holding \"..\"", id)
	}
	return nil
}

// ReplicasStream is the name of the stream behind the replicas bucket,
// KV_<P>_REPLICAS.
func (n Names) ReplicasStream() string { return BucketStream(n.ReplicasBucket()) }

// ReplicasFilter matches every key of the replicas bucket.
func (n Names) ReplicasFilter() string { return BucketSubject(n.ReplicasBucket(), ">") }

// NATS keeps a key-value bucket B in the stream KV_B, and its key K under
// the subject $KV.B.K. BucketStream, BucketOfStream and BucketSubject are
// the one place that spells this.
const (
	bucketStreamPrefix  = "KV_"
	bucketSubjectPrefix = "$KV."
)

// BucketStream is the name of the stream that holds bucket.
func BucketStream(bucket string) string { return bucketStreamPrefix + bucket }

// BucketOfStream is the bucket that stream holds, false when stream is not
// named as a bucket's.
func BucketOfStream(stream string) (string, bool) {
	return strings.CutPrefix(stream, bucketStreamPrefix)
}

// BucketSubject is the subject of key in bucket; key "" gives the prefix
// every key's subject starts with.
func BucketSubject(bucket, key string) string { return bucketSubjectPrefix + bucket + "." + key }

// ConfigSubject is the subject of one entry's config events.
func (n Names) ConfigSubject(entryID string) string { return n.Prefix() + ".config." + entryID }

// ConfigFilter matches every config subject.
func (n Names) ConfigFilter() string { return n.Prefix() + ".config.>" }

// FailPauseSubject is the subject of one entry's fail-pause requests: a
// replica that saw a task of the entry archived asks there for the pause of
// the entry, armed with pause_on_failure (DecodeFailPause says what
// such a request may hold). The config stream captures it beside the
// entry's config subject, so the entry's history holds both.
func (n Names) FailPauseSubject(entryID string) string { return n.Prefix() + ".failpause." + entryID }

// FailPauseFilter matches every fail-pause subject.
func (n Names) FailPauseFilter() string { return n.Prefix() + ".failpause.>" }

// ConfigStreamSubjects are the subjects the config stream captures, and
// what every reader of the whole configuration's history filters on:
// config events and fail-pause requests. (A wildcard over both,
// <p>.*.>, would also match what else the stream may have been made to
// store, such as a copy of an activity message a NATS server delivered
// there: readers never use it.)
func (n Names) ConfigStreamSubjects() []string {
	return []string{n.ConfigFilter(), n.FailPauseFilter()}
}

// EntrySubjects are the subjects of one entry's history in the config
// stream: its config events and its fail-pause requests.
func (n Names) EntrySubjects(entryID string) []string {
	return []string{n.ConfigSubject(entryID), n.FailPauseSubject(entryID)}
}

// EntryRevisionFilter is the one subject filter under which an entry's
// writes are conditional (Nats-Expected-Last-Subject-Sequence-Subject):
// <p>.*.<entry>, which within the config stream matches its config and
// fail-pause subjects, so a write expects the entry's last message on
// either. An entry's revision, for optimistic concurrency, is the
// sequence of the last message of the config stream under this filter.
func (n Names) EntryRevisionFilter(entryID string) string { return n.Prefix() + ".*." + entryID }

// FireSubject is the subject of one entry's fired and skipped events.
func (n Names) FireSubject(entryID string) string { return n.Prefix() + ".fire." + entryID }

// FireFilter matches every fire subject.
func (n Names) FireFilter() string { return n.Prefix() + ".fire.>" }

// RecoveryFilter matches every recovery subject.
func (n Names) RecoveryFilter() string { return n.Prefix() + ".recovery.>" }

// RecoverySubject is the subject of one queue's recovery outcomes.
func (n Names) RecoverySubject(queue string) string {
	return n.Prefix() + ".recovery." + EncodeQueueToken(queue)
}

// ActivitySubjects are the subjects the activity stream captures.
func (n Names) ActivitySubjects() []string {
	return []string{n.FireFilter(), n.RecoveryFilter()}
}

// EntryFromConfigSubject returns the entry id of a config subject.
func (n Names) EntryFromConfigSubject(subject string) (string, bool) {
	return cutToken(subject, n.Prefix()+".config.")
}

// EveryEntryRevisionFilter is EntryRevisionFilter for every entry at
// once, <p>.*.*: within the config stream it matches every config and
// fail-pause subject, and any other two-token subject the stream was made
// to store (callers keep those that EntryFromHistorySubject accepts).
func (n Names) EveryEntryRevisionFilter() string { return n.Prefix() + ".*.*" }

// EntryFromFailPauseSubject returns the entry id of a fail-pause subject.
func (n Names) EntryFromFailPauseSubject(subject string) (string, bool) {
	return cutToken(subject, n.Prefix()+".failpause.")
}

// EntryFromHistorySubject returns the entry id of a subject of the config
// stream's history, a config or a fail-pause subject, and whether it is
// the fail-pause subject.
func (n Names) EntryFromHistorySubject(subject string) (id string, failPause, ok bool) {
	if id, ok := n.EntryFromConfigSubject(subject); ok {
		return id, false, true
	}
	id, ok = n.EntryFromFailPauseSubject(subject)
	return id, ok, ok
}

// EntryFromFireSubject returns the entry id of a fire subject.
func (n Names) EntryFromFireSubject(subject string) (string, bool) {
	return cutToken(subject, n.Prefix()+".fire.")
}

// QueueFromRecoverySubject returns the queue name of a recovery subject.
func (n Names) QueueFromRecoverySubject(subject string) (string, bool) {
	tok, ok := cutToken(subject, n.Prefix()+".recovery.")
	if !ok {
		return "", false
	}
	q, err := DecodeQueueToken(tok)
	return q, err == nil
}

func cutToken(subject, head string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, head)
	if !ok || tok == "" || strings.Contains(tok, ".") {
		return "", false
	}
	return tok, true
}

// EncodeQueueToken turns any asynq queue name into one subject token,
// reversibly: A-Z a-z 0-9 _ - stand for themselves (so ordinary names stay
// readable), every other byte is ~ and two lower-case hex digits, and the
// empty name is a lone ~.
func EncodeQueueToken(queue string) string {
	if queue == "" {
		return "~"
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(queue))
	for i := 0; i < len(queue); i++ {
		c := queue[i]
		if isTokenByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('~')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

// DecodeQueueToken reverses EncodeQueueToken. Only the canonical encoding
// is accepted, so each queue has exactly one token.
func DecodeQueueToken(tok string) (string, error) {
	if tok == "~" {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("empty queue token")
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if isTokenByte(c) {
			out = append(out, c)
			continue
		}
		if c != '~' || i+2 >= len(tok) {
			return "", fmt.Errorf("queue token %q: bad byte at %d", tok, i)
		}
		hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("queue token %q: bad escape at %d", tok, i)
		}
		v := byte(hi<<4 | lo)
		if isTokenByte(v) {
			return "", fmt.Errorf("queue token %q: needless escape at %d", tok, i)
		}
		out = append(out, v)
		i += 2
	}
	return string(out), nil
}

func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// unhex accepts only lower-case digits: the encoding is canonical.
func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}
