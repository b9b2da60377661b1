package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // zones must load on minimal images with no zoneinfo
	"unicode/utf8"

	"github.com/robfig/cron/v3"
)

// Defaults applied by Normalize; they are asynq's client defaults so a task
// fired by cronstream looks like one enqueued with asynq's zero options.
const (
	DefaultQueue         = "default"
	DefaultMaxRetry      = 25
	DefaultTimeout       = Duration(30 * time.Minute)
	DefaultTimezone      = "UTC"
	DefaultCatchupWindow = Duration(time.Hour)

	// MaxPayloadBytes bounds a task payload; a periodic task that carries
	// more belongs in storage the task points to.
	MaxPayloadBytes = 1 << 20
	maxIDLen        = 128
	maxNoteLen      = 1024
	maxOwnerLen     = 128
	maxHeaders      = 64
	maxQueueLen     = 256
	maxJitter       = Duration(24 * time.Hour)
	maxWindow       = Duration(366 * 24 * time.Hour)
)

// CatchupPolicy says what a replica does with ticks it missed while no
// replica was running.
type CatchupPolicy string

// Catch-up policies.
const (
	CatchupNone   CatchupPolicy = "none"   // future ticks only
	CatchupLatest CatchupPolicy = "latest" // the most recent missed tick within the window
	CatchupAll    CatchupPolicy = "all"    // every missed tick within the window, oldest first
)

// OverlapPolicy says whether a tick fires while the previous task of the
// entry is still in the queue.
type OverlapPolicy string

// Overlap policies.
const (
	OverlapAllow OverlapPolicy = "allow"
	OverlapSkip  OverlapPolicy = "skip"
	// OverlapBufferOne holds one tick in Redis while the previous task is
	// busy and fires it, with its original scheduled time, once that task
	// is done; further ticks meanwhile are skipped (docs/entries.md).
	OverlapBufferOne OverlapPolicy = "buffer-one"
	// OverlapCancelPrevious replaces the previous task: one still waiting
	// (pending, scheduled, retry, aggregating) is deleted and the tick fires
	// at once; a running one is cancelled through asynq and the tick is held
	// as buffer-one holds it until that task has stopped (docs/entries.md).
	OverlapCancelPrevious OverlapPolicy = "cancel-previous"
)

// Entry is the full state of one periodic entry. A config event's data is
// the entry as it is after the change, so the last event on an entry's
// subject is its current state. The JSON field names are the contract.
type Entry struct {
	ID       string        `json:"id"`
	Cron     string        `json:"cron"`
	Timezone string        `json:"timezone,omitempty"`
	Task     Task          `json:"task"`
	Options  Options       `json:"options"`
	Catchup  Catchup       `json:"catchup"`
	Overlap  OverlapPolicy `json:"overlap,omitempty"`
	Jitter   Duration      `json:"jitter,omitempty"`
	Paused   bool          `json:"paused,omitempty"`
	Note     string        `json:"note,omitempty"`
	Owner    string        `json:"owner,omitempty"`
	Removed  bool          `json:"removed,omitempty"`

	// The schedule fields below change which ticks fire, or (labels) what
	// an earlier build would drop on a rewrite, so an entry that sets any
	// of them is published under a gated event type that earlier builds
	// refuse (see Gated). Unset, they leave the JSON byte for byte as it
	// was before they existed.

	// StartAt and EndAt bound the entry's ticks: none before StartAt or
	// after EndAt (both inclusive, whole seconds, UTC once normalized).
	StartAt time.Time `json:"start_at,omitzero"`
	EndAt   time.Time `json:"end_at,omitzero"`
	// Exclude are cron specs, in the entry's zone, whose matching ticks are
	// not fired but recorded as skipped with reason "excluded".
	Exclude []string `json:"exclude,omitempty"`
	// Labels organise entries; selectors (ParseSelector) filter on them.
	Labels map[string]string `json:"labels,omitempty"`
	// PauseOnFailure pauses the entry, through a config event whose note
	// names the task and its last error, when one of its tasks is archived
	// (retries exhausted, by a worker or the recoverer): package failpause.
	// Gated too: an earlier build's client would drop it on a rewrite.
	PauseOnFailure bool `json:"pause_on_failure,omitempty"`
	// MaxFires, when set (at least 1), stops the entry after that many of
	// its scheduled ticks created a task, counted from the revision where
	// MaxFires last changed value (projector.State.MaxFiresSince); the
	// entry then shows as completed. Triggers and backfills do not count.
	MaxFires int `json:"max_fires,omitempty"`
	// TickHeaders adds the entry id and the scheduled tick (and, for a
	// trigger or a backfill, which it is) to each task as asynq headers
	// (TaskHeaders). Gated: an earlier build would fire without them.
	TickHeaders bool `json:"tick_headers,omitempty"`
}

// Task is what each firing enqueues.
type Task struct {
	Type    string            `json:"type"`
	Payload []byte            `json:"payload,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Options are the asynq options of each fired task.
type Options struct {
	Queue    string   `json:"queue,omitempty"`
	MaxRetry *int     `json:"max_retry,omitempty"`
	Timeout  Duration `json:"timeout,omitempty"`
	// Deadline is relative to the tick's scheduled time: a task fired for
	// 09:00 with deadline 1h must finish by 10:00 (asynq's absolute
	// Deadline option makes no sense for a task that repeats).
	Deadline  Duration `json:"deadline,omitempty"`
	Unique    Duration `json:"unique,omitempty"`
	Retention Duration `json:"retention,omitempty"`
	Group     string   `json:"group,omitempty"`
}

// Retries returns the entry's max retry count with the default applied.
func (o Options) Retries() int {
	if o.MaxRetry == nil {
		return DefaultMaxRetry
	}
	return *o.MaxRetry
}

// QueueName returns the queue with the default applied.
func (o Options) QueueName() string {
	if o.Queue == "" {
		return DefaultQueue
	}
	return o.Queue
}

// Catchup is the catch-up policy and how far back it looks.
type Catchup struct {
	Policy CatchupPolicy `json:"policy,omitempty"`
	Window Duration      `json:"window,omitempty"`
}

// Normalize returns a copy of e with every default written out, so the
// state stored in the stream says exactly what fires.
func (e Entry) Normalize() Entry {
	n := e.Clone()
	n.normalize()
	return n
}

// normalize applies the defaults in place.
func (n *Entry) normalize() {
	if n.Timezone == "" {
		n.Timezone = DefaultTimezone
	}
	if n.Options.Queue == "" {
		n.Options.Queue = DefaultQueue
	}
	if n.Options.MaxRetry == nil {
		r := DefaultMaxRetry
		n.Options.MaxRetry = &r
	}
	if n.Options.Timeout == 0 && n.Options.Deadline == 0 {
		n.Options.Timeout = DefaultTimeout
	}
	if n.Catchup.Policy == "" {
		n.Catchup.Policy = CatchupNone
	}
	if n.Catchup.Policy != CatchupNone && n.Catchup.Window == 0 {
		n.Catchup.Window = DefaultCatchupWindow
	}
	if n.Overlap == "" {
		n.Overlap = OverlapAllow
	}
	if len(n.Task.Payload) == 0 {
		n.Task.Payload = nil
	}
	if len(n.Task.Headers) == 0 {
		n.Task.Headers = nil
	}
	n.StartAt, n.EndAt = normalTime(n.StartAt), normalTime(n.EndAt)
	if len(n.Exclude) == 0 {
		n.Exclude = nil
	}
	if len(n.Labels) == 0 {
		n.Labels = nil
	}
}

// Clone returns a deep copy of e.
func (e Entry) Clone() Entry {
	c := e
	if e.Task.Payload != nil {
		c.Task.Payload = bytes.Clone(e.Task.Payload)
	}
	if e.Task.Headers != nil {
		c.Task.Headers = make(map[string]string, len(e.Task.Headers))
		for k, v := range e.Task.Headers {
			c.Task.Headers[k] = v
		}
	}
	if e.Options.MaxRetry != nil {
		r := *e.Options.MaxRetry
		c.Options.MaxRetry = &r
	}
	c.Exclude = slices.Clone(e.Exclude)
	c.Labels = maps.Clone(e.Labels)
	return c
}

// SameContent reports whether a and b describe the same entry once
// defaults are applied. A put whose content is the same as the current
// state publishes nothing.
func SameContent(a, b Entry) bool {
	ja, errA := json.Marshal(a.Normalize())
	jb, errB := json.Marshal(b.Normalize())
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// Location loads the entry's timezone (UTC when empty).
func (e Entry) Location() (*time.Location, error) {
	tz := e.Timezone
	if tz == "" {
		tz = DefaultTimezone
	}
	if tz == "Local" {
		// LoadLocation accepts it, but it is each host's own zone:
		// replicas would compute different fire times.
		return nil, fmt.Errorf("timezone %q is the host's zone, not an IANA zone", tz)
	}
	loc, err := loadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("unknown timezone %q", tz)
	}
	return loc, nil
}

// ErrInvalidEntry is wrapped by every validation error.
var ErrInvalidEntry = errors.New("invalid entry")

// FieldError names the field of an entry that failed validation and why.
type FieldError struct {
	Field  string // JSON path, e.g. "options.max_retry"
	Value  string // the offending value, shortened
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidEntry) true for field errors.
func (e *FieldError) Unwrap() error { return ErrInvalidEntry }

// ValidateID checks an entry id: 1-128 characters of [A-Za-z0-9_-], so an id
// is always exactly one subject token.
func ValidateID(id string) error {
	ok := len(id) >= 1 && len(id) <= maxIDLen
	for i := 0; ok && i < len(id); i++ {
		ok = isTokenByte(id[i])
	}
	if !ok {
		return &FieldError{Field: "id", Value: shorten(id), Reason: fmt.Sprintf("must be 1-%d characters of A-Z a-z 0-9 _ -", maxIDLen)}
	}
	return nil
}

// ValidateListedID accepts every id a config subject can carry, which is
// what `entry ls` lists: one subject token, not a wildcard, without
// whitespace. It is looser than ValidateID so that whatever another
// publisher wrote on a config subject can be removed.
func ValidateListedID(id string) error {
	ok := id != "" && id != "*" && id != ">" && !strings.ContainsAny(id, ". \t\r\n")
	if !ok {
		return &FieldError{Field: "id", Value: shorten(id), Reason: "must be one NATS subject token (no '.', spaces, or a lone '*' or '>')"}
	}
	return nil
}

// Validate checks every field of e (defaults are applied first, so an
// omitted field is never an error). The error joins one *FieldError per
// problem, each naming its field and value.
func (e Entry) Validate() error {
	return e.Normalize().validateNormalized()
}

// validateNormalized is Validate of an entry with its defaults applied.
// The problems are listed in field order.
func (n Entry) validateNormalized() error {
	var errs fieldErrors
	if err := ValidateID(n.ID); err != nil {
		errs = append(errs, err)
	}
	loc, err := n.Location()
	if err != nil {
		errs.add("timezone", n.Timezone, "not an IANA time zone")
		loc = time.UTC
	}
	if n.Cron == "" {
		errs.add("cron", "", "required")
	} else if _, err := ParseCron(n.Cron, loc); err != nil {
		errs.add("cron", n.Cron, err.Error())
	}
	n.Task.validate(&errs)
	n.Options.validate(&errs)
	n.validatePolicies(&errs)
	if len(n.Note) > maxNoteLen || !utf8.ValidString(n.Note) {
		errs.add("note", n.Note, fmt.Sprintf("must be valid UTF-8 of at most %d bytes", maxNoteLen))
	}
	if len(n.Owner) > maxOwnerLen || !utf8.ValidString(n.Owner) {
		errs.add("owner", n.Owner, fmt.Sprintf("must be valid UTF-8 of at most %d bytes", maxOwnerLen))
	}
	errs = append(errs, n.validateSchedule(loc)...)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("entry %q: %w", shorten(n.ID), errors.Join(errs...))
}

// fieldErrors collects the problems of one entry.
type fieldErrors []error

// add records a *FieldError.
func (f *fieldErrors) add(field, value, reason string) {
	*f = append(*f, &FieldError{Field: field, Value: shorten(value), Reason: reason})
}

// validate checks the task's type, payload and headers.
func (t Task) validate(errs *fieldErrors) {
	switch {
	case strings.TrimSpace(t.Type) == "":
		errs.add("task.type", t.Type, "required (must not be blank)")
	case !utf8.ValidString(t.Type):
		errs.add("task.type", t.Type, "must be valid UTF-8")
	}
	if len(t.Payload) > MaxPayloadBytes {
		errs.add("task.payload", fmt.Sprintf("%d bytes", len(t.Payload)), fmt.Sprintf("larger than %d bytes", MaxPayloadBytes))
	}
	if len(t.Headers) > maxHeaders {
		errs.add("task.headers", fmt.Sprintf("%d headers", len(t.Headers)), fmt.Sprintf("at most %d headers", maxHeaders))
	}
	for k, v := range t.Headers {
		if k == "" || !utf8.ValidString(k) || !utf8.ValidString(v) {
			errs.add("task.headers", k, "header names must be non-empty and names and values valid UTF-8")
		}
	}
}

// validate checks the asynq options of normalized options (MaxRetry set).
func (o Options) validate(errs *fieldErrors) {
	switch q := o.Queue; {
	case len(q) > maxQueueLen:
		errs.add("options.queue", q, fmt.Sprintf("longer than %d bytes", maxQueueLen))
	case !utf8.ValidString(q):
		errs.add("options.queue", q, "must be valid UTF-8")
	case strings.HasPrefix(q, "}"):
		// asynq's keys would get an empty hash tag and scatter over a cluster.
		errs.add("options.queue", q, "must not start with '}'")
	}
	if r := *o.MaxRetry; r < 0 || r > 1<<31-1 {
		errs.add("options.max_retry", fmt.Sprint(r), "must be between 0 and 2147483647")
	}
	checkDur := func(field string, d Duration, min Duration) {
		if d < 0 {
			errs.add(field, d.String(), "must not be negative")
		} else if d != 0 && d < min {
			errs.add(field, d.String(), fmt.Sprintf("must be at least %s", min))
		}
	}
	checkDur("options.timeout", o.Timeout, Duration(time.Second))
	checkDur("options.deadline", o.Deadline, Duration(time.Second))
	checkDur("options.unique", o.Unique, Duration(time.Second))
	checkDur("options.retention", o.Retention, Duration(time.Second))
	if g := o.Group; !utf8.ValidString(g) {
		errs.add("options.group", g, "must be valid UTF-8")
	}
}

// validatePolicies checks what the scheduler does with ticks: catch-up,
// overlap (and what it cannot be combined with) and jitter.
func (n Entry) validatePolicies(errs *fieldErrors) {
	switch n.Catchup.Policy {
	case CatchupNone, CatchupLatest, CatchupAll:
	default:
		errs.add("catchup.policy", string(n.Catchup.Policy), "must be none, latest or all")
	}
	if w := n.Catchup.Window; w < 0 || w > maxWindow {
		errs.add("catchup.window", w.String(), fmt.Sprintf("must be between 0 and %s", maxWindow))
	}
	switch n.Overlap {
	case OverlapAllow, OverlapSkip:
	case OverlapBufferOne, OverlapCancelPrevious:
		// A held tick is released as a plain pending task: a group or a
		// unique lock would be taken at a later instant than the tick's.
		if n.Options.Group != "" {
			errs.add("overlap", string(n.Overlap), "cannot be combined with options.group")
		}
		if n.Options.Unique != 0 {
			errs.add("overlap", string(n.Overlap), "cannot be combined with options.unique")
		}
		// A buffer-one release counts against max_fires; a cancel-previous
		// release does not.
		if n.Overlap == OverlapCancelPrevious && n.MaxFires != 0 {
			errs.add("overlap", string(n.Overlap), "cannot be combined with max_fires")
		}
	default:
		errs.add("overlap", string(n.Overlap), "must be allow, skip, buffer-one or cancel-previous")
	}
	if j := n.Jitter; j < 0 || j > maxJitter {
		errs.add("jitter", j.String(), fmt.Sprintf("must be between 0 and %s", maxJitter))
	}
}

// cronParser accepts 5 fields or 6 with leading seconds, descriptors
// (@daily, @every 5m) and a CRON_TZ=/TZ= prefix.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCron parses a cron spec the way every replica does, evaluating specs
// without a CRON_TZ= prefix in loc.
func ParseCron(spec string, loc *time.Location) (sched cron.Schedule, err error) {
	// robfig/cron has panicked on odd input in the past; a bad spec from the
	// stream must be an error, never a crash of every replica.
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("unparseable cron spec: %v", r)
		}
	}()
	if strings.TrimSpace(spec) != spec || spec == "" {
		return nil, fmt.Errorf("must not be empty or have surrounding spaces")
	}
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if rest, ok := strings.CutPrefix(spec, p); ok {
			if zone, _, _ := strings.Cut(rest, " "); zone == "Local" {
				return nil, fmt.Errorf("%sLocal is each host's own zone: name an IANA zone", p)
			}
		}
	}
	if every, ok := strings.CutPrefix(spec, "@every "); ok {
		d, err := time.ParseDuration(every)
		if err != nil {
			return nil, fmt.Errorf("@every needs a Go duration: %v", err)
		}
		if d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("@every needs a whole number of seconds, at least 1s")
		}
	}
	key := cronKey{spec: spec}
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") && !strings.HasPrefix(spec, "@every ") && loc != nil {
		key.zone, key.zoned = loc.String(), true
	}
	if c, ok := cronCache.get(key); ok {
		return c.sched, c.err
	}
	full := spec
	if key.zoned {
		full = "CRON_TZ=" + key.zone + " " + spec
	}
	c := parsedCron{}
	if isCalendarSpec(full) {
		c.sched, c.err = parseCalendarSchedule(full)
	} else {
		c.sched, c.err = cronParser.Parse(full)
		if c.err == nil && c.sched.Next(time.Now()).IsZero() {
			c.sched, c.err = nil, fmt.Errorf("never fires (no matching date)")
		}
	}
	cronCache.put(key, c)
	return c.sched, c.err
}

// Parsing a spec (which loads its zone from the embedded database) and
// loading a zone cost tens of microseconds; a projection of 100,000 entries
// validates every one at start, mostly with the same few specs and zones.
// Parsed schedules are immutable, so sharing them is safe.
type parsedCron struct {
	sched cron.Schedule
	err   error
}

// cronKey is a spec and the zone it is evaluated in, when it names none
// itself: as the cache's key it costs no allocation per lookup.
type cronKey struct {
	spec  string
	zone  string
	zoned bool
}

var (
	cronCache = newBoundedCache[cronKey, parsedCron](4096)
	zoneCache = newBoundedCache[string, *time.Location](1024)
)

func loadLocation(tz string) (*time.Location, error) {
	if loc, ok := zoneCache.get(tz); ok {
		return loc, nil
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, err // unknown zones are not cached: tzdata does not change at run time, but input does
	}
	zoneCache.put(tz, loc)
	return loc, nil
}

// boundedCache is a map that forgets everything when it is full: enough for
// a working set of specs and zones, and never a leak for arbitrary input.
type boundedCache[K comparable, V any] struct {
	mu  sync.RWMutex
	max int
	m   map[K]V
}

func newBoundedCache[K comparable, V any](max int) *boundedCache[K, V] {
	return &boundedCache[K, V]{max: max, m: make(map[K]V)}
}

func (c *boundedCache[K, V]) get(k K) (V, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

func (c *boundedCache[K, V]) put(k K, v V) {
	c.mu.Lock()
	if len(c.m) >= c.max {
		c.m = make(map[K]V, c.max)
	}
	c.m[k] = v
	c.mu.Unlock()
}

func shorten(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
