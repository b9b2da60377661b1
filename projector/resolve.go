package projector

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
)

// resolver completes the projection's initial load. That load reads the
// last message of each subject (DeliverLastPerSubject), which decides an
// entry when the last message on its config subject is a config event
// (config events carry the full state) and nothing, or a fail-pause
// request that expects that event's revision, follows it on its
// fail-pause subject. Otherwise the last messages do not decide it:
//
//   - the last message on its config subject is a NATS server's reply (see
//     events.IsServerWritten): the entry's state is that of its history
//     before it;
//   - a fail-pause message follows its config event but does not expect
//     its revision: the message right after the config event may have been
//     a request that paused the entry, hidden by the last one.
//
// For such an entry the resolver reads the entry's history before the
// message, and the fold rebuilds the entry from it (Fold.resolve) before
// it applies the message. Once the load has read everything, every
// message is read as it comes, and nothing needs resolving.
type resolver struct {
	js      jetstream.JetStream
	names   events.Names
	log     *slog.Logger
	loading bool
	// configs holds, while loading, the sequence of each entry's config
	// event read so far.
	configs map[string]uint64
}

func newResolver(js jetstream.JetStream, names events.Names, log *slog.Logger) *resolver {
	return &resolver{js: js, names: names, log: log, loading: true, configs: map[string]uint64{}}
}

// done ends the initial load.
func (r *resolver) done() {
	r.loading, r.configs = false, nil
}

// history returns the history of m's entry before m when the initial load
// needs it to decide the entry, nil otherwise; pending is the consumer's
// count of messages after m (none: the load is complete). The error is
// ctx's, or the connection's closing.
func (r *resolver) history(ctx context.Context, m message, pending uint64) ([]message, error) {
	if !r.loading {
		return nil, nil
	}
	if pending == 0 {
		defer r.done()
	}
	id, failPause, ok := r.names.EntryFromHistorySubject(m.subject)
	if !ok || events.ValidateID(id) != nil {
		return nil, nil
	}
	if !failPause {
		if !events.IsServerWritten(m.header, m.data) {
			r.configs[id] = m.seq
			return nil, nil
		}
		delete(r.configs, id)
		return r.read(ctx, id, m.seq)
	}
	config := r.configs[id]
	if config == 0 {
		// No config event before it: a later one decides the entry, or
		// none registered it (requests are refused), or the last was a
		// server reply, after which requests are refused.
		return nil, nil
	}
	if req, err := events.DecodeFailPause(r.names, id, m.header, m.data); err == nil && req.Expected == config {
		return nil, nil
	}
	return r.read(ctx, id, m.seq)
}

// read returns the messages of entry id's subjects before sequence
// before, oldest first (never nil).
func (r *resolver) read(ctx context.Context, id string, before uint64) ([]message, error) {
	rd := &orderedReader{
		js:      r.js,
		stream:  r.names.ConfigStream(),
		filters: r.names.EntrySubjects(id),
		policy:  jetstream.DeliverAllPolicy,
		hb:      DefaultHeartbeat,
		log:     r.log,
	}
	defer rd.close()
	out := []message{}
	for {
		// The message at before is on the entry's subjects: the read ends.
		msg, meta, err := rd.next(ctx, 0)
		if errors.Is(err, errStreamReplaced) {
			// The load's own reader finds it too and starts again.
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if meta.Sequence.Stream >= before {
			r.log.Info("projector: entry read from its history: its last messages did not decide it", "entry", id, "messages", len(out))
			return out, nil
		}
		out = append(out, message{subject: msg.Subject(), seq: meta.Sequence.Stream, at: meta.Timestamp, header: msg.Headers(), data: msg.Data()})
	}
}
