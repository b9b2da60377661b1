package projector

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// AsOfSeq returns the registered-entry map and the quarantined entries
// exactly as they were after the config event at stream sequence seq (or the
// last one before it): a fold over the full history, independent of any live
// projection. Seq 0 is before the first event (an empty map); a seq beyond
// the stream's end means its end now.
func AsOfSeq(ctx context.Context, js jetstream.JetStream, names events.Names, seq uint64) (map[string]State, []Quarantine, error) {
	return asOf(ctx, js, names, seq, nil)
}

// AsOfTime is AsOfSeq up to the last config event the stream stored at or
// before t, by the stream's timestamps: the fold stops at the first event
// stored after t. (Timestamps follow the stream order unless the leader's
// clock stepped back; the stream order is what counts.)
func AsOfTime(ctx context.Context, js jetstream.JetStream, names events.Names, t time.Time) (map[string]State, []Quarantine, error) {
	return asOf(ctx, js, names, math.MaxUint64, &t)
}

// asOf folds the history up to seq and, with until, up to the last event
// stored at or before *until.
//
// Only what decides each entry up to the bound reaches the Fold: its last
// config event (config events carry the full state; a NATS server's reply
// stored on the subject is not one) and the message that came next on its
// subjects, which can only be a fail-pause request that pauses it (a
// request holds only right after a config event). Decoding the events the
// fold would overwrite is wasted work. Reading still covers the whole
// history, so the cost is one pass over the stream plus one or two
// decodes per entry.
func asOf(ctx context.Context, js jetstream.JetStream, names events.Names, seq uint64, until *time.Time) (map[string]State, []Quarantine, error) {
	name := names.ConfigStream()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return nil, nil, fmt.Errorf("replay: look up stream %s: %w", name, err)
	}
	// The end as of now makes the replay terminate on an idle stream.
	seq = min(seq, stream.CachedInfo().State.LastSeq)
	fold := NewFold(names)
	if seq == 0 {
		return fold.Map(), fold.Quarantined(), nil
	}
	r := &orderedReader{
		js:      js,
		stream:  name,
		filters: names.ConfigStreamSubjects(),
		policy:  jetstream.DeliverAllPolicy,
		hb:      DefaultHeartbeat,
		log:     slog.Default(),
	}
	defer r.close()
	decisive := make(map[string]*asOfEntry)
	for {
		msg, meta, err := r.next(ctx, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("replay %s up to seq %d: %w", name, seq, err)
		}
		s := meta.Sequence.Stream
		if s > seq || (until != nil && meta.Timestamp.After(*until)) {
			break
		}
		m := message{subject: msg.Subject(), seq: s, at: meta.Timestamp, header: msg.Headers(), data: msg.Data()}
		if id, failPause, ok := names.EntryFromHistorySubject(m.subject); ok {
			e := decisive[id]
			if e == nil {
				e = &asOfEntry{}
				decisive[id] = e
			}
			e.add(m, failPause)
		}
		if s >= seq || meta.NumPending == 0 {
			break
		}
	}
	var ordered []message
	for _, e := range decisive {
		ordered = e.appendTo(ordered)
	}
	slices.SortFunc(ordered, func(a, b message) int { return cmp.Compare(a.seq, b.seq) })
	// Bad events are reported through the returned quarantines; a replay
	// does not log what the live projection already logged.
	for _, d := range decodeBatch(names, ordered) {
		_, _, _ = fold.commit(d)
	}
	return fold.Map(), fold.Quarantined(), nil
}

// asOfEntry is what decides an entry in a replay: its last config event
// and the message after it on its subjects.
type asOfEntry struct {
	config, next message
	hasConfig    bool
	hasNext      bool
	nextIsPause  bool
}

func (e *asOfEntry) add(m message, failPause bool) {
	if !failPause && !events.IsServerWritten(m.header, m.data) {
		*e = asOfEntry{config: m, hasConfig: true}
		return
	}
	if e.hasConfig && !e.hasNext {
		e.next, e.hasNext, e.nextIsPause = m, true, failPause
	}
}

// appendTo appends the messages the fold needs of the entry.
func (e *asOfEntry) appendTo(out []message) []message {
	if !e.hasConfig {
		return out // nothing registered it: requests are refused
	}
	out = append(out, e.config)
	if e.hasNext && e.nextIsPause {
		out = append(out, e.next)
	}
	return out
}
