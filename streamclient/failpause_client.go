package streamclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

// ErrSubjectNotCaptured is wrapped by the error of a write to a subject no
// stream captures: a config stream made before fail-pause requests, which
// `cronstream streams apply` brings up to date.
var ErrSubjectNotCaptured = errors.New("no stream captures the subject")

// capturesSubject reports whether one of a stream's subjects matches
// subject.
func capturesSubject(streamSubjects []string, subject string) bool {
	for _, s := range streamSubjects {
		if subjectMatches(s, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the literal subject matches filter, with
// NATS wildcards (* one token, > the rest).
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, t := range f {
		switch {
		case t == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case t != "*" && t != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// FailPause asks for the pause of entry id on failure with a fail-pause
// request: rev is the entry's revision the caller saw armed (its config
// event's sequence), and note names the task and its error (it must start
// with FailPauseNotePrefix). The request is conditional on rev over both
// of the entry's subjects: a *ConflictError when the entry changed since,
// ErrNotArmed when it is not armed at rev, ErrNotFound when it does not
// exist. A stream that does not capture the fail-pause subject (made
// before this build, until `cronstream streams apply`) makes it fail with
// ErrSubjectNotCaptured.
func (c *Client) FailPause(ctx context.Context, id string, rev uint64, note string) (Result, error) {
	if err := contract.ValidateID(id); err != nil {
		return Result{}, fmt.Errorf("fail-pause: %w", err)
	}
	if !strings.HasPrefix(note, contract.FailPauseNotePrefix) {
		return Result{}, fmt.Errorf("fail-pause entry %q: the note must start with %q", id, contract.FailPauseNotePrefix)
	}
	cur, err := c.read(ctx, id, true)
	if err != nil {
		return Result{}, fmt.Errorf("fail-pause entry %q: %w", id, err)
	}
	if cur.rev != rev || cur.base != rev || cur.failPause {
		return Result{}, &ConflictError{Entry: id, Expected: rev, Current: cur.rev}
	}
	e, err := cur.live(id)
	if err != nil {
		return Result{}, err
	}
	if !e.PauseOnFailure || e.Paused {
		return Result{}, fmt.Errorf("fail-pause entry %q at revision %d: %w", id, rev, contract.ErrNotArmed)
	}
	e.Paused, e.Note = true, note
	if err := e.Validate(); err != nil {
		return Result{}, fmt.Errorf("fail-pause: %w", err)
	}
	typ := contract.GatedType(contract.TypeEntryPaused, e)
	data, err := json.Marshal(e)
	if err != nil {
		return Result{}, fmt.Errorf("fail-pause: encode entry %q: %w", id, err)
	}
	ev, err := contract.NewEventAt(contract.NewEventID(), c.now(), typ, c.source, id, json.RawMessage(data))
	if err != nil {
		return Result{}, err
	}
	seq, err := c.publish(ctx, c.names.FailPauseSubject(id), ev, rev, false)
	if err != nil {
		c.seen.drop(id)
		if errors.Is(err, ErrRevisionConflict) {
			return Result{}, err
		}
		return Result{}, fmt.Errorf("fail-pause entry %q: %w", id, err)
	}
	stored := e.Clone()
	c.seen.put(id, state{rev: seq, base: seq, failPause: true, ev: ev, entry: &stored, canon: data})
	return Result{Revision: seq, Type: typ, Entry: e}, nil
}

// CheckFailPause decides whether a message stored on a fail-pause subject
// is a request that applies, as every reader folding the entry's history
// decides: nil when it does, an error wrapping ErrFailPauseRefused saying
// why not, another error when the stream could not be read. It reads the
// one message the request expects (a request applies only right after a
// config event of an armed entry, and the server guarantees nothing came
// between), so a reader that shows messages one by one (audit) can tell.
func (c *Client) CheckFailPause(ctx context.Context, subject string, header nats.Header, data []byte) error {
	id, failPause, ok := c.names.EntryFromHistorySubject(subject)
	if !ok || !failPause {
		return refusedRequest("subject %q is not a fail-pause subject", subject)
	}
	req, err := contract.DecodeFailPause(c.names, id, header, data)
	if err != nil {
		return err
	}
	var base *storedMsg
	err = c.retry(ctx, "read the revision a fail-pause request expects", func(actx context.Context) (bool, error) {
		var err error
		base, err = c.msgGet(actx, msgGetRequest{Seq: req.Expected})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			base, err = nil, nil
		}
		return isTransient(err), err
	})
	switch {
	case err != nil:
		return err
	case base == nil || base.Subject != c.names.ConfigSubject(id) || contract.IsServerWritten(base.Header, base.Data):
		return refusedRequest("the message at revision %d is not a config event of entry %q", req.Expected, id)
	}
	s := c.decodeState(base.Subject, base.Sequence, base.Time, base.Data)
	if s.err != nil {
		return refusedRequest("entry %q is quarantined at revision %d", id, req.Expected)
	}
	return req.Check(s.entry, req.Expected)
}

// refusedRequest is an error wrapping ErrFailPauseRefused, as
// DecodeFailPause's and Check's are.
func refusedRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", contract.ErrFailPauseRefused, fmt.Sprintf(format, args...))
}
