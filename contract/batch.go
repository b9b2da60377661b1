package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// An activity message holds one event, or a batch of them: a JSON array of
// structured-mode events (CloudEvents' batched JSON format). The recoverer
// writes the outcomes of one move of a queue's tasks as one batch, so a
// mass crash is a few hundred messages for the stream to store instead of
// one per task; every event in a batch keeps its own id, type and data.
// Readers of the activity stream go through SplitEvents or DecodeEvents.

// BatchID is the Nats-Msg-Id of a batch of n events whose first event has
// id first. The recover script builds the same id (a taskstate test holds
// them equal); it is distinct from every event id, whose kinds never are
// "batch".
func BatchID(n int, first string) string {
	return "batch:" + strconv.Itoa(n) + ":" + first
}

// IsBatch reports whether an activity message is a batch of events.
func IsBatch(msg []byte) bool {
	i := 0
	for i < len(msg) && (msg[i] == ' ' || msg[i] == '\t' || msg[i] == '\n' || msg[i] == '\r') {
		i++
	}
	return i < len(msg) && msg[i] == '['
}

// SplitEvents returns the events of an activity message, each as its own
// JSON: the message itself when it is one event, the elements of the array
// when it is a batch. A batch that is not a JSON array of objects is
// malformed (ErrMalformedEvent); the elements are not checked beyond that.
func SplitEvents(msg []byte) ([][]byte, error) {
	if !IsBatch(msg) {
		return [][]byte{msg}, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(msg, &raw); err != nil {
		return nil, fmt.Errorf("%w: batch: %v", ErrMalformedEvent, err)
	}
	out := make([][]byte, len(raw))
	for i, r := range raw {
		if len(r) == 0 || r[0] != '{' {
			return nil, fmt.Errorf("%w: batch element %d is not an object", ErrMalformedEvent, i)
		}
		out[i] = r
	}
	return out, nil
}

// DecodeEvents decodes every event of an activity message (DecodeEvent for
// each). It stops at the first event that does not decode.
func DecodeEvents(msg []byte) ([]*Event, error) {
	parts, err := SplitEvents(msg)
	if err != nil {
		return nil, err
	}
	out := make([]*Event, 0, len(parts))
	for i, p := range parts {
		ev, err := DecodeEvent(p)
		if err != nil {
			if len(parts) > 1 {
				err = fmt.Errorf("batch element %d: %w", i, err)
			}
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}
