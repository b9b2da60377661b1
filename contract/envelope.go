package contract

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// SpecVersion is the CloudEvents version of every event cronstream writes.
const SpecVersion = "1.0"

// Event types. Config events carry the entry's full state; activity events
// carry what happened.
const (
	TypeEntryRegistered = "cronstream.entry.registered"
	TypeEntryUpdated    = "cronstream.entry.updated"
	TypeEntryPaused     = "cronstream.entry.paused"
	TypeEntryResumed    = "cronstream.entry.resumed"
	TypeEntryRemoved    = "cronstream.entry.removed"

	TypeEntryFired           = "cronstream.entry.fired"
	TypeEntrySkipped         = "cronstream.entry.skipped"
	TypeTaskRetried          = "cronstream.task.retried"
	TypeTaskArchived         = "cronstream.task.archived"
	TypeAggregationReclaimed = "cronstream.aggregation.reclaimed"
	contentTypeJSON          = "application/json"
	maxEventIDLen            = 256
	maxSourceLen             = 1024
)

// TypeTaskCancelled: overlap cancel-previous replaced an entry's previous
// task (TaskCancelled). Builds before it drop it in the relay (an
// unroutable record, logged) and ignore it on read.
const TypeTaskCancelled = "cronstream.task.cancelled"

// TypeTaskLost: Redis lost fires the activity stream records (TasksLost),
// found when a lost watermark was restored and written in the step that
// restored it. Builds before it drop it in the relay (an unroutable
// record, logged) and ignore it on read.
const TypeTaskLost = "cronstream.task.lost"

// ConfigTypes lists the config event types in the order a reader would
// expect to meet them in an entry's life.
var ConfigTypes = []string{TypeEntryRegistered, TypeEntryUpdated, TypeEntryPaused, TypeEntryResumed, TypeEntryRemoved}

// GatedSuffix marks the gated form of a config event type: the same change,
// of an entry that sets a field builds before the schedule fields (start_at,
// end_at, exclude, labels, pause_on_failure) do not know (Entry.Gated). Those builds refuse
// the type as unknown and quarantine the entry instead of ignoring the
// field and misfiring. This build decodes a gated event's data strictly: a
// field it does not know makes the event bad, so a later build's gated
// fields are refused here in turn. Removals are never gated: every build
// applies them.
const GatedSuffix = ".v2"

// GatedType returns the type to publish a change of kind typ (one of
// ConfigTypes) to entry e as: typ itself unless e is gated.
func GatedType(typ string, e Entry) string {
	if typ == TypeEntryRemoved || !e.Gated() || strings.HasSuffix(typ, GatedSuffix) {
		return typ
	}
	return typ + GatedSuffix
}

// ConfigKind returns the plain config type of t (t without GatedSuffix), so
// readers branch on the kind of change whichever form carried it.
func ConfigKind(t string) string {
	if k, ok := strings.CutSuffix(t, GatedSuffix); ok && k != TypeEntryRemoved && isPlainConfigType(k) {
		return k
	}
	return t
}

// IsGatedType reports whether t is the gated form of a config type.
func IsGatedType(t string) bool { return ConfigKind(t) != t }

// IsConfigType reports whether t is a config event type this version knows,
// plain or gated.
func IsConfigType(t string) bool {
	return isPlainConfigType(ConfigKind(t))
}

func isPlainConfigType(t string) bool {
	switch t {
	case TypeEntryRegistered, TypeEntryUpdated, TypeEntryPaused, TypeEntryResumed, TypeEntryRemoved:
		return true
	}
	return false
}

// Event is a CloudEvents 1.0 event in structured JSON mode. Data stays raw
// until a reader asks for it, so an event of an unknown type still decodes
// and can be shown as it is.
type Event struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
}

// ErrMalformedEvent is wrapped by every decoding error of an event envelope.
var ErrMalformedEvent = errors.New("malformed event")

// NewEventID returns a new unique event id (128 random bits, hex). It is
// also the Nats-Msg-Id of the publish that carries the event.
func NewEventID() string {
	var b [16]byte
	// Since Go 1.24 crypto/rand.Read never returns an error: it aborts the
	// process instead, so an id can never silently repeat.
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewEvent builds an event with a fresh id and the current UTC time,
// marshalling data as JSON.
func NewEvent(typ, source, subject string, data any) (*Event, error) {
	return NewEventAt(NewEventID(), time.Now(), typ, source, subject, data)
}

// NewEventAt is NewEvent with the id and time given, for events whose id
// must be derived deterministically (fires, recoveries) so that a retried
// publish deduplicates.
func NewEventAt(id string, at time.Time, typ, source, subject string, data any) (*Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("marshal %s data: %w", typ, err)
	}
	return &Event{
		SpecVersion:     SpecVersion,
		ID:              id,
		Source:          source,
		Type:            typ,
		Subject:         subject,
		Time:            at.UTC().Truncate(time.Microsecond),
		DataContentType: contentTypeJSON,
		Data:            raw,
	}, nil
}

// Marshal encodes the event as structured-mode JSON.
func (e *Event) Marshal() ([]byte, error) {
	return json.Marshal(e)
}

// DecodeEvent parses a structured-mode CloudEvent. Unknown fields are
// ignored and an unknown type is not an error; a missing id, type,
// specversion or an unsupported specversion is.
func DecodeEvent(b []byte) (*Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	return &e, nil
}

// check is DecodeEvent's verdict on a decoded envelope.
func (e *Event) check() error {
	switch {
	case e.SpecVersion != SpecVersion:
		return fmt.Errorf("%w: specversion %q, want %q", ErrMalformedEvent, e.SpecVersion, SpecVersion)
	case e.ID == "" || len(e.ID) > maxEventIDLen:
		return fmt.Errorf("%w: id must be 1-%d characters", ErrMalformedEvent, maxEventIDLen)
	case e.Type == "":
		return fmt.Errorf("%w: missing type", ErrMalformedEvent)
	case len(e.Source) > maxSourceLen:
		return fmt.Errorf("%w: source longer than %d", ErrMalformedEvent, maxSourceLen)
	}
	return nil
}

// DecodeData unmarshals the event's data into v.
func (e *Event) DecodeData(v any) error {
	return e.decodeData(v, false)
}

// decodeData is DecodeData, refusing fields v does not have when strict.
func (e *Event) decodeData(v any, strict bool) error {
	if len(e.Data) == 0 || string(e.Data) == "null" {
		return fmt.Errorf("%w: %s event %s has no data", ErrMalformedEvent, e.Type, e.ID)
	}
	var err error
	if !strict {
		err = json.Unmarshal(e.Data, v)
	} else {
		d := json.NewDecoder(bytes.NewReader(e.Data))
		d.DisallowUnknownFields()
		if err = d.Decode(v); err == nil {
			if _, terr := d.Token(); terr != io.EOF {
				err = errors.New("invalid data after top-level value")
			}
		}
	}
	if err != nil {
		if strict && strings.HasPrefix(err.Error(), "json: unknown field") {
			return fmt.Errorf("%w: %s event %s data: %v this build does not know: a later build's schedule field it cannot apply", ErrMalformedEvent, e.Type, e.ID, err)
		}
		return fmt.Errorf("%w: %s event %s data: %v", ErrMalformedEvent, e.Type, e.ID, err)
	}
	return nil
}
