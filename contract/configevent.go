package contract

import "fmt"

// DecodeConfigEvent decodes a config event and the entry state it
// carries, normalized. The event is returned whenever the envelope decodes,
// so audit can show a bad event as it is; the error (wrapping
// ErrMalformedEvent, and ErrInvalidEntry when the state fails validation)
// says why the state cannot be applied: an unknown type, data that does not
// decode or validate, an id that is not the event's subject (when it has
// one), or a type that contradicts the state (removed, paused, resumed).
// The caller checks that the id matches the NATS subject the event was
// stored on.
func DecodeConfigEvent(b []byte) (*Event, *Entry, error) {
	e := new(Entry)
	ev, err := DecodeConfigEventInto(b, e)
	if err != nil {
		return ev, nil, err
	}
	return ev, e, nil
}

// DecodeConfigEventInto is DecodeConfigEvent decoding the entry into *e,
// for a caller that keeps it inside a value of its own (the projector's
// State) and so pays one allocation for both. *e is overwritten; after an
// error it holds nothing of use.
func DecodeConfigEventInto(b []byte, e *Entry) (*Event, error) {
	*e = Entry{}
	// The form cronstream writes takes the fast path; anything else, and
	// every error, is decided by encoding/json (see decodeConfigFast).
	ev, fast := decodeConfigFast(b, e)
	var err error
	if fast {
		err = ev.check()
	} else {
		ev, err = DecodeEvent(b)
	}
	if err != nil {
		return nil, err
	}
	if err := checkAsWritten(ev, b, fast); err != nil {
		return ev, err
	}
	if !IsConfigType(ev.Type) {
		return ev, fmt.Errorf("%w: event %s has unknown config event type %q", ErrMalformedEvent, ev.ID, ev.Type)
	}
	gated := IsGatedType(ev.Type)
	if gated || !fast {
		// A gated event must hold only fields this build knows: one it
		// does not is a later build's schedule field that it cannot apply.
		*e = Entry{}
		if err := ev.decodeData(e, gated); err != nil {
			return ev, err
		}
	}
	// e is ours alone: defaults go in place, with no copy.
	e.normalize()
	e.shareRepeated(!fast || gated)
	// A removal needs only to name its entry: a removed entry never fires,
	// and a removal is how an entry whose state or id is not valid (written
	// by another publisher, say) is cleaned up.
	if ev.Type == TypeEntryRemoved && e.Removed {
		if e.ID == "" {
			return ev, fmt.Errorf("%w: %s event %s without an entry id", ErrMalformedEvent, ev.Type, ev.ID)
		}
	} else if err := e.validateNormalized(); err != nil {
		return ev, fmt.Errorf("%w: %s event %s: %w", ErrMalformedEvent, ev.Type, ev.ID, err)
	}
	kind := ConfigKind(ev.Type)
	switch {
	case ev.Subject != "" && ev.Subject != e.ID:
		return ev, fmt.Errorf("%w: %s event %s: event subject %q does not match entry id %q", ErrMalformedEvent, ev.Type, ev.ID, ev.Subject, e.ID)
	case kind == TypeEntryRemoved && !e.Removed:
		return ev, fmt.Errorf("%w: %s event %s without removed=true", ErrMalformedEvent, ev.Type, ev.ID)
	case kind != TypeEntryRemoved && e.Removed:
		return ev, fmt.Errorf("%w: %s event %s with removed=true", ErrMalformedEvent, ev.Type, ev.ID)
	case kind == TypeEntryPaused && !e.Paused, kind == TypeEntryResumed && e.Paused:
		return ev, fmt.Errorf("%w: %s event %s with paused=%t", ErrMalformedEvent, ev.Type, ev.ID, e.Paused)
	}
	return ev, nil
}
