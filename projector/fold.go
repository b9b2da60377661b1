package projector

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cronstream/cronstream/events"
)

// State is one registered entry as a projection holds it. States are shared
// between the projection, its readers and its subscribers: treat them, and
// the maps and slices inside Entry, as read-only (Entry.Clone before
// changing one).
type State struct {
	// Entry is the entry's state with every default written out
	// (events.Entry.Normalize), so it says exactly what fires.
	Entry events.Entry
	// Revision is the stream sequence of the entry's last config event.
	Revision uint64
	// MaxFiresSince is the revision where Entry.MaxFires last changed value
	// (0 when the entry has no limit): its fires are counted from there, so
	// re-sending the same state does not restart the count, and a changed
	// limit starts afresh. A re-registration after a removal or a
	// quarantine is a change.
	MaxFiresSince uint64
	// Time is when the stream stored that event (the JetStream timestamp,
	// not the publisher's CloudEvents time).
	Time time.Time
	// FailPause says the event at Revision is a fail-pause request (on
	// <p>.failpause.<entry>: a replica paused the entry on failure), not a
	// config event.
	FailPause bool
}

// RevisionSubject is the subject of the message at s.Revision: the
// entry's config subject, or its fail-pause subject.
func (s *State) RevisionSubject(names events.Names) string {
	if s.FailPause {
		return names.FailPauseSubject(s.Entry.ID)
	}
	return names.ConfigSubject(s.Entry.ID)
}

// Change is one change to the set of registered entries. Old and New are nil
// where the entry is absent: registered (Old nil), removed (New nil), or
// quarantined by a bad event (New nil, Quarantined true).
type Change struct {
	ID  string
	Old *State
	New *State
	// Seq is the stream sequence of the event behind the change (of the
	// latest one, when a subscription coalesced several), and Time when the
	// stream stored it; Time is zero where no one event is behind the
	// change: an entry a reload found gone without a removal event (a
	// recreated stream), or quarantined since.
	Seq  uint64
	Time time.Time
	// Quarantined says New is nil because a bad event quarantined the entry,
	// not because it was removed.
	Quarantined bool
}

// Quarantine is an entry that does not fire because its last config event
// could not be applied. It stays quarantined until a valid event for it
// arrives.
type Quarantine struct {
	ID     string
	Seq    uint64    // stream sequence of the bad event
	Time   time.Time // when the stream stored it
	Reason string
}

// Stats counts what a fold did with the messages it was given.
type Stats struct {
	LastSeq uint64 // highest stream sequence processed, good or bad
	Applied uint64 // valid config events and fail-pause requests applied
	Bad     uint64 // bad events on an entry's subject; each quarantined its entry
	Ignored uint64 // messages on a subject without a valid entry id
	// Refused counts messages on an entry's subjects that changed
	// nothing and quarantined nothing: fail-pause requests that do not
	// hold, NATS server replies stored there.
	Refused uint64
	// RefusedLive counts those the projector met while following the
	// stream (each logged), not in its initial load (Projector only).
	RefusedLive uint64
	Duplicates  uint64 // messages at or below LastSeq, skipped
	Entries     int    // registered entries now (quarantined ones excluded)
	Quarantined int    // quarantined entries now
	Resets      uint64 // consumer re-created after an error (Projector only)
	// Reloads counts projections reloaded because the stream was recreated
	// or restored (Projector only).
	Reloads uint64
}

// ErrBadEvent is wrapped by every *BadEventError.
var ErrBadEvent = errors.New("bad config event")

// BadEventError describes a message of the config stream that could not be
// applied. Entry is empty when the subject names no valid entry id (the
// message is ignored); otherwise the entry was quarantined.
type BadEventError struct {
	Seq     uint64
	Subject string
	Entry   string
	Reason  string
}

func (e *BadEventError) Error() string {
	if e.Entry == "" {
		return fmt.Sprintf("%v at seq %d on %q: %s", ErrBadEvent, e.Seq, e.Subject, e.Reason)
	}
	return fmt.Sprintf("%v at seq %d for entry %q: %s", ErrBadEvent, e.Seq, e.Entry, e.Reason)
}

// Unwrap makes errors.Is(err, ErrBadEvent) true.
func (e *BadEventError) Unwrap() error { return ErrBadEvent }

// ErrRefused is wrapped by every *RefusedError.
var ErrRefused = errors.New("config stream message refused")

// RefusedError describes a message on an entry's subjects that the fold
// did not apply and that does not quarantine the entry: a fail-pause
// request that does not hold (events.DecodeFailPause,
// FailPauseRequest.Check), or a NATS server's reply stored there
// (events.IsServerWritten). The entry keeps its state.
type RefusedError struct {
	Seq     uint64
	Subject string
	Entry   string
	Reason  string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v at seq %d for entry %q: %s", ErrRefused, e.Seq, e.Entry, e.Reason)
}

// Unwrap makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Fold is the one function from config events to the registered-entry map.
// The live Projector and the point-in-time replays (AsOfSeq, AsOfTime) both
// apply messages through it, so they cannot disagree. Apply is two steps,
// decode (pure, so the projector and the replays run it on several messages
// in parallel) and commit (in stream order); nothing else changes a Fold.
//
// The result for an entry depends only on the entry's last event: a valid
// event sets (or, if removed, deletes) its state whatever came before, and a
// bad one quarantines it. This is what lets the live projection start from
// the last message per subject instead of the whole history.
//
// A Fold is not safe for concurrent use.
type Fold struct {
	names       events.Names
	entries     map[string]*State
	quarantined map[string]Quarantine
	// removed holds each removed entry's last state as its removal event
	// carried it, without its task's payload and headers, labels and note,
	// Revision and Time the removal's, until the entry is registered again
	// or quarantined: a subscriber that starts later learns of the removal
	// from it (Subscription.Removed).
	removed map[string]*State
	// queues counts the entries of each queue among entries and removed:
	// the queues whose shards replicas own (Projector.Queues).
	queues map[string]int
	stats  Stats
	// The message at stats.LastSeq, for LastMessageID.
	lastSubject string
	lastAt      time.Time
	// The last message on a config subject (not a fail-pause one), for
	// FenceSeq.
	fenceSeq     uint64
	fenceSubject string
	fenceAt      time.Time
}

// NewFold returns an empty fold for the config stream named by names.
func NewFold(names events.Names) *Fold {
	return &Fold{
		names:       names,
		entries:     make(map[string]*State),
		quarantined: make(map[string]Quarantine),
		removed:     make(map[string]*State),
		queues:      make(map[string]int),
	}
}

// Apply folds one message of the config stream: its subject, stream sequence,
// stream timestamp and data. Messages must come in stream order; one at or
// below the last sequence applied is a duplicate and is skipped. A message
// on a fail-pause subject needs its headers: ApplyMessage.
//
// It returns the change to the registered-entry map and whether there was
// one, and a *BadEventError (wrapping ErrBadEvent) when the message could not
// be applied: then the entry it names was quarantined (the returned change
// takes it out of the map), or, for a subject without a valid entry id, the
// message was ignored. A bad message never stops the fold.
func (f *Fold) Apply(subject string, seq uint64, at time.Time, data []byte) (Change, bool, error) {
	return f.ApplyMessage(subject, seq, at, nil, data)
}

// ApplyMessage is Apply with the headers the stream stored with the
// message. A fail-pause request that does not hold, or a NATS server's
// reply stored on an entry's subject, returns a *RefusedError and changes
// nothing.
func (f *Fold) ApplyMessage(subject string, seq uint64, at time.Time, header nats.Header, data []byte) (Change, bool, error) {
	return f.commit(decode(f.names, message{subject: subject, seq: seq, at: at, header: header, data: data}))
}

// message is one message of the config stream as the fold needs it.
type message struct {
	subject string
	seq     uint64
	at      time.Time // stream timestamp
	header  nats.Header
	data    []byte
	// resolve, set by the projector's initial load, is the history of the
	// message's entry before it: the fold rebuilds the entry from it
	// before it applies the message (see resolver).
	resolve []message
}

// minDecodePerWorker keeps small batches (live traffic) on the caller's
// goroutine, where starting workers would cost more than it saves.
const minDecodePerWorker = 32

// decodeBatch decodes msgs in order of the result, on up to GOMAXPROCS
// goroutines: decoding needs no fold state and is most of the work of a cold
// start or a replay, while committing must stay sequential.
func decodeBatch(names events.Names, msgs []message) []decoded {
	out := make([]decoded, len(msgs))
	workers := min(runtime.GOMAXPROCS(0), len(msgs)/minDecodePerWorker)
	if workers <= 1 {
		for i, m := range msgs {
			out[i] = decode(names, m)
		}
		return out
	}
	chunk := (len(msgs) + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < len(msgs); lo += chunk {
		hi := min(lo+chunk, len(msgs))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				out[i] = decode(names, msgs[i])
			}
		})
	}
	wg.Wait()
	return out
}

// decoded is a message parsed and checked, ready to commit. Decoding needs no
// fold state, so the projector does it outside its lock.
type decoded struct {
	seq     uint64
	at      time.Time
	subject string
	id      string // "" when the subject names no entry
	state   *State // nil for removals and bad events
	removal *State // a removal's last state (its Revision and Time the removal's)
	bad     *BadEventError
	// request is a fail-pause request, checked against the entry's state
	// when committed; refused says why a message changes nothing.
	request *events.FailPauseRequest
	refused string
	resolve []decoded // see message.resolve
}

func decode(names events.Names, m message) decoded {
	subject, seq, at := m.subject, m.seq, m.at
	d := decoded{seq: seq, at: at, subject: subject}
	if m.resolve != nil {
		d.resolve = decodeBatch(names, m.resolve)
	}
	// Any one subject token names an entry, as `entry ls` lists it: one
	// whose id validation refuses is quarantined under it (its events
	// cannot be valid, but a removal clears it), so status shows what was
	// published there.
	id, failPause, ok := names.EntryFromHistorySubject(subject)
	if !ok || events.ValidateListedID(id) != nil {
		d.bad = &BadEventError{Seq: seq, Subject: subject, Reason: "subject has no valid entry id"}
		return d
	}
	if events.IsServerWritten(m.header, m.data) {
		d.id = strings.Clone(id)
		d.refused = events.ServerWrittenReason(subject)
		return d
	}
	if failPause {
		d.id = strings.Clone(id)
		req, err := events.DecodeFailPause(names, id, m.header, m.data)
		if err != nil {
			d.refused = err.Error()
		} else {
			d.request = req
		}
		return d
	}
	fail := func(format string, args ...any) decoded {
		// The id is a substring of the subject; a copy lets the subject go.
		d.id = strings.Clone(id)
		d.bad = &BadEventError{Seq: seq, Subject: subject, Entry: d.id, Reason: fmt.Sprintf(format, args...)}
		return d
	}
	// One decoder decides what a valid config event is, for the projector,
	// the config client and audit alike. It writes the entry into the state
	// it will be kept in.
	st := &State{Revision: seq, Time: at}
	if _, err := events.DecodeConfigEventInto(m.data, &st.Entry); err != nil {
		return fail("%v", err)
	}
	if st.Entry.ID != id {
		return fail("data.id %q does not match the entry of the subject", st.Entry.ID)
	}
	// The map's key is the state's own id, not a second copy.
	d.id = st.Entry.ID
	if st.Entry.Removed {
		if events.ValidateID(d.id) != nil {
			// Never registered (its events cannot be valid): the removal
			// only clears its quarantine.
			return d
		}
		// Kept until the entry is registered again, for its schedule and
		// queue alone (Subscription.Removed): what its tasks carried goes.
		st.Entry.Task.Payload, st.Entry.Task.Headers, st.Entry.Labels, st.Entry.Note = nil, nil, nil, ""
		d.removal = st
		return d
	}
	d.state = st
	return d
}

func (f *Fold) commit(d decoded) (Change, bool, error) {
	if d.id != "" && d.seq > f.stats.LastSeq {
		f.countQueues(d.id, -1)
		defer f.countQueues(d.id, 1)
	}
	if d.seq <= f.stats.LastSeq {
		f.stats.Duplicates++
		return Change{}, false, nil
	}
	f.stats.LastSeq = d.seq
	f.lastSubject, f.lastAt = d.subject, d.at
	if _, failPause, _ := f.names.EntryFromHistorySubject(d.subject); !failPause {
		f.fenceSeq, f.fenceSubject, f.fenceAt = d.seq, d.subject, d.at
	}
	if d.id == "" {
		f.stats.Ignored++
		return Change{}, false, d.bad
	}
	return f.commitEntry(d, true)
}

// resolve rebuilds entry id from its history before a message (the
// initial load read only the last message of each subject, and that did
// not decide the entry): the entry's state goes, and its history is
// folded afresh, without counting or reporting what was counted or
// reported before. It returns the change from the entry's former state.
func (f *Fold) resolve(id string, history []decoded) (Change, bool) {
	old := f.entries[id]
	_, wasQuarantined := f.quarantined[id]
	delete(f.entries, id)
	delete(f.quarantined, id)
	delete(f.removed, id)
	var last decoded
	for _, d := range history {
		if d.id == id {
			_, _, _ = f.commitEntry(d, false)
			last = d
		}
	}
	now := f.entries[id]
	_, q := f.quarantined[id]
	if (old == nil) == (now == nil) && (old == nil || reflect.DeepEqual(*old, *now)) && wasQuarantined == q {
		return Change{}, false
	}
	ch := Change{ID: id, Old: old, New: now, Seq: last.seq, Time: last.at, Quarantined: q}
	return ch, old != nil || now != nil
}

// commitEntry applies a message of an entry's subjects to the entry;
// count says whether it counts in the fold's stats.
func (f *Fold) commitEntry(d decoded, count bool) (Change, bool, error) {
	inc := func(n *uint64) {
		if count {
			*n++
		}
	}
	if d.request != nil || d.refused != "" {
		return f.commitRequest(d, inc)
	}
	old := f.entries[d.id]
	ch := Change{ID: d.id, Old: old, Seq: d.seq, Time: d.at}
	if d.bad != nil {
		inc(&f.stats.Bad)
		delete(f.entries, d.id)
		f.quarantined[d.id] = Quarantine{ID: d.id, Seq: d.seq, Time: d.at, Reason: d.bad.Reason}
		delete(f.removed, d.id)
		ch.Quarantined = true
		return ch, old != nil, d.bad
	}
	inc(&f.stats.Applied)
	delete(f.quarantined, d.id)
	if d.state == nil {
		delete(f.entries, d.id)
		if d.removal != nil {
			f.removed[d.id] = d.removal
		}
		return ch, old != nil, nil
	}
	delete(f.removed, d.id)
	if old != nil {
		d.state.MaxFiresSince = events.MaxFiresSince(&old.Entry, old.MaxFiresSince, d.state.Entry, d.seq)
	} else {
		d.state.MaxFiresSince = events.MaxFiresSince(nil, 0, d.state.Entry, d.seq)
	}
	f.entries[d.id] = d.state
	ch.New = d.state
	return ch, true, nil
}

// countQueues adds n to the count of the queue entry id is registered or
// was removed in.
func (f *Fold) countQueues(id string, n int) {
	st := f.entries[id]
	if st == nil {
		st = f.removed[id]
	}
	if st == nil {
		return
	}
	q := st.Entry.Options.QueueName()
	if f.queues[q] += n; f.queues[q] <= 0 {
		delete(f.queues, q)
	}
}

// Queues returns, sorted, the queues that registered entries use or
// removed ones used last.
func (f *Fold) Queues() []string {
	out := make([]string, 0, len(f.queues))
	for q := range f.queues {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

// commitRequest applies a fail-pause request, or refuses it (or a NATS
// server's reply): a request holds only against a state set by a config
// event (FailPauseRequest.Check), and can only pause it.
func (f *Fold) commitRequest(d decoded, inc func(*uint64)) (Change, bool, error) {
	old := f.entries[d.id]
	reason := d.refused
	if reason == "" {
		var base *events.Entry
		var baseRev uint64
		if old != nil && !old.FailPause {
			base, baseRev = &old.Entry, old.Revision
		}
		if err := d.request.Check(base, baseRev); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		inc(&f.stats.Refused)
		return Change{}, false, &RefusedError{Seq: d.seq, Subject: d.subject, Entry: d.id, Reason: reason}
	}
	inc(&f.stats.Applied)
	st := &State{Entry: *d.request.Entry, Revision: d.seq, Time: d.at, MaxFiresSince: old.MaxFiresSince, FailPause: true}
	f.entries[d.id] = st
	return Change{ID: d.id, Old: old, New: st, Seq: d.seq, Time: d.at}, true, nil
}

// Get returns the registered entry id; quarantined and removed entries are
// absent.
func (f *Fold) Get(id string) (State, bool) {
	s, ok := f.entries[id]
	if !ok {
		return State{}, false
	}
	return *s, true
}

// Len returns the number of registered entries.
func (f *Fold) Len() int { return len(f.entries) }

// Map returns a copy of the registered-entry map.
func (f *Fold) Map() map[string]State {
	m := make(map[string]State, len(f.entries))
	for id, s := range f.entries {
		m[id] = *s
	}
	return m
}

// Entries returns the registered entries sorted by id.
func (f *Fold) Entries() []State {
	out := make([]State, 0, len(f.entries))
	for _, s := range f.entries {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b State) int { return cmp.Compare(a.Entry.ID, b.Entry.ID) })
	return out
}

// States returns the registered entries in no order, shared: see
// Projector.States.
func (f *Fold) States() []*State {
	out := make([]*State, 0, len(f.entries))
	for _, s := range f.entries {
		out = append(out, s)
	}
	return out
}

// Quarantined returns the quarantined entries sorted by id.
func (f *Fold) Quarantined() []Quarantine {
	out := make([]Quarantine, 0, len(f.quarantined))
	for _, q := range f.quarantined {
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b Quarantine) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// LastSeq returns the highest stream sequence processed.
func (f *Fold) LastSeq() uint64 { return f.stats.LastSeq }

// FenceSeq returns the highest sequence processed of a message on a
// config subject, leaving fail-pause requests out: what a replica
// presents to the revision fence (docs/invariants.md, INV-revision-fence).
// Replicas of earlier builds read config subjects alone, and a request
// (anyone with a replica credential can publish one) must fence no one
// out.
func (f *Fold) FenceSeq() uint64 { return f.fenceSeq }

// LastMessageID returns events.ConfigMessageID of the message at LastSeq
// ("" before any).
func (f *Fold) LastMessageID() string {
	if f.stats.LastSeq == 0 {
		return ""
	}
	return events.ConfigMessageID(f.lastSubject, f.lastAt)
}

// Stats returns the fold's counters.
func (f *Fold) Stats() Stats {
	s := f.stats
	s.Entries = len(f.entries)
	s.Quarantined = len(f.quarantined)
	return s
}

// removals returns every removed entry's removal as a change from its
// last state, in stream order.
func (f *Fold) removals() []Change {
	out := make([]Change, 0, len(f.removed))
	for id, s := range f.removed {
		out = append(out, Change{ID: id, Old: s, Seq: s.Revision, Time: s.Time})
	}
	slices.SortFunc(out, func(a, b Change) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// snapshot returns every registered entry as a change from nothing, in
// stream order: what a new subscriber has not seen yet.
func (f *Fold) snapshot() []Change {
	out := make([]Change, 0, len(f.entries))
	for id, s := range f.entries {
		out = append(out, Change{ID: id, New: s, Seq: s.Revision, Time: s.Time})
	}
	slices.SortFunc(out, func(a, b Change) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
