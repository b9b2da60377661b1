package asynqconv

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// Registration is one asynq periodic registration: the cron spec, the task
// and the options of asynq's Scheduler.Register, which asynq keeps in Redis
// as a SchedulerEntry (all but the headers).
type Registration struct {
	Spec    string
	Type    string
	Payload []byte
	// Headers are the task's headers (asynq.NewTaskWithHeaders). asynq's
	// SchedulerEntry does not keep them.
	Headers map[string]string
	// Options are the String() forms of the options in the order asynq
	// applies them: those given to NewTask first, then those given to
	// Register (a later option of a kind wins). asynq's SchedulerEntry
	// keeps only those given to Register.
	Options []string
}

// Entry converts r into an entry: its derived id (EntryID), its cron spec,
// task and options. Timezone, owner and the cronstream fields asynq has no
// option for are left to the caller. Every option that does not convert is
// in the error, each as an *OptionError; so is a spec asynq would run
// differently from cronstream (see Spec).
func (r Registration) Entry() (contract.Entry, error) {
	var errs []error
	spec, err := Spec(r.Spec)
	if err != nil {
		errs = append(errs, err)
	}
	var o contract.Options
	if err := ApplyOptions(&o, r.Options); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return contract.Entry{}, errors.Join(errs...)
	}
	e := contract.Entry{
		Cron:    spec,
		Task:    contract.Task{Type: r.Type, Payload: r.Payload, Headers: maps.Clone(r.Headers)},
		Options: o,
	}
	e.ID = EntryID(e)
	return e, nil
}

// Spec returns the cron spec as cronstream writes it for an asynq spec:
// surrounding spaces dropped (asynq's parser ignores them). It refuses,
// with a *SpecError, an @every interval that is not a whole number of
// seconds of at least one: asynq's parser runs it at another interval (it
// rounds down to whole seconds, and up to one), so taking it as written
// would change the schedule. Anything else cronstream's validation checks
// when the entry is put.
func Spec(spec string) (string, error) {
	s := strings.TrimSpace(spec)
	if every, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(every))
		if err == nil && (d < time.Second || d%time.Second != 0) {
			runs := max(d.Truncate(time.Second), time.Second)
			return "", &SpecError{Spec: spec, Runs: "@every " + contract.Duration(runs).String()}
		}
	}
	return s, nil
}

// SpecError is an asynq spec that asynq runs as another one.
type SpecError struct {
	Spec string // as registered
	Runs string // the spec asynq runs: what cronstream must be given
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("cron spec %q: asynq runs it as %q (it rounds @every to whole seconds, at least one); write that", e.Spec, e.Runs)
}

// idHashVersion is mixed into every derived id: a change to what the hash
// covers must change this, or an entry would keep its id while meaning
// something else.
const idHashVersion = "asynq-registration/1"

// maxSlug bounds the readable part of a derived id.
const maxSlug = 48

// EntryID is the id of the entry an asynq registration becomes: the task
// type made readable (lower case, runs of other characters as one '-', at
// most 48 characters), '-', and 16 hex digits of a SHA-256 over the
// registration: cron spec, task type, payload, headers and the resolved
// options (queue, max retry, timeout, deadline, unique, retention and group,
// defaults written out, so option order and restating a default do not
// matter). Like asynq's PeriodicTaskManager's hash it covers spec, type,
// payload and options, so the same registration gets the same id in every
// process and across restarts, and a changed one a new id; unlike it, it is
// always a valid entry id (1-128 of [A-Za-z0-9_-]). The time zone and the
// cronstream fields (catch-up, overlap, labels, ...) are not covered: they
// can change without the entry becoming another one. e must carry the
// registration's spec, task and options; the rest is ignored.
func EntryID(e contract.Entry) string {
	h := sha256.New()
	field := func(s string) { writeField(h, []byte(s)) }
	field(idHashVersion)
	field(e.Cron)
	field(e.Task.Type)
	writeField(h, e.Task.Payload)
	field(strconv.Itoa(len(e.Task.Headers)))
	for _, k := range slices.Sorted(maps.Keys(e.Task.Headers)) {
		field(k)
		field(e.Task.Headers[k])
	}
	o := contract.Entry{Options: e.Options}.Normalize().Options
	field(o.Queue)
	field(strconv.Itoa(*o.MaxRetry))
	for _, d := range []contract.Duration{o.Timeout, o.Deadline, o.Unique, o.Retention} {
		field(strconv.FormatInt(int64(d), 10))
	}
	field(o.Group)
	return slug(e.Task.Type) + "-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// writeField writes b length-prefixed, so no two field lists hash alike.
func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// slug is the readable part of a derived id: "report:daily" → "report-daily".
func slug(typ string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(typ) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			if b.Len() >= maxSlug {
				break
			}
			continue
		}
		dash = true
	}
	if b.Len() == 0 {
		return "asynq"
	}
	return b.String()
}
