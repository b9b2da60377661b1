package relay

// Sending a batch: routing each record to its subject, expanding compact
// records, splitting what the server cannot take in one message, checking
// old records against the stream, and waiting for the acknowledgements.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/outbox"
	"github.com/cronstream/cronstream/internal/taskstate"
)

// ErrNewerRecord reports an outbox record written by a newer cronstream in
// a form this relay does not read; it stays in the outbox.
var ErrNewerRecord = errors.New("outbox record from a newer version")

// envelopeHead is the part of an event the relay needs to route it.
type envelopeHead struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
}

// subjectOf maps an event to its activity subject.
func (r *Relay) subjectOf(h envelopeHead) (string, error) {
	switch h.Type {
	case events.TypeEntryFired, events.TypeEntrySkipped, events.TypeTaskCancelled, events.TypeTaskLost:
		if events.ValidateID(h.Subject) != nil {
			return "", fmt.Errorf("event %s: %s with bad entry %q", h.ID, h.Type, h.Subject)
		}
		return r.cfg.Names.FireSubject(h.Subject), nil
	case events.TypeTaskRetried, events.TypeTaskArchived, events.TypeAggregationReclaimed:
		return r.cfg.Names.RecoverySubject(h.Subject), nil
	}
	return "", fmt.Errorf("event %s: type %q does not belong in the activity stream", h.ID, h.Type)
}

// firedEventBytes is about the length of an expanded fired event, to size
// a batch's buffer.
const firedEventBytes = 448

// sending is a batch of records on its way to the stream.
type sending struct {
	r    *Relay
	recs []taskstate.OutboxRecord
	// msgs[j] carries recs[at[j]]; records dropped or found in the stream
	// already count as done without a publish.
	msgs []pubMsg
	at   []int
	// events is how many messages the records made, published or not.
	events int
	// stop ends the batch before recs[end].
	stop error
	end  int
	sent *sentBatch
	// mark is the events.HeaderRedisUnconfirmed value of its messages.
	mark string
	// seen looks up old records' messages in the stream (add).
	seen *publishedSince
}

// send publishes recs in order without waiting for the stream's
// acknowledgements; wait collects them. It stops before the first record
// it may not publish yet, so order is kept.
// Its messages carry mark (readBatch) as events.HeaderRedisUnconfirmed.
func (r *Relay) send(ctx context.Context, queue string, recs []taskstate.OutboxRecord, mark string) *sending {
	s := &sending{r: r, recs: recs, msgs: make([]pubMsg, 0, len(recs)), at: make([]int, 0, len(recs)), end: len(recs), mark: mark}
	// The expanded events of the batch share one buffer (single).
	var expanded []byte
	for i, rec := range recs {
		if outbox.FormOf(rec.Data) == outbox.RecordNewer {
			// Written by a newer cronstream: history this relay cannot
			// read, so it must not drop it either. Stop before it; the
			// outbox is yielded and a newer replica publishes it.
			s.stop, s.end = fmt.Errorf("outbox record %s (event %s) is in a newer format than this replica reads: %w", rec.StreamID, rec.EventID, ErrNewerRecord), i
			break
		}
		msgs, ok := r.messagesOf(queue, rec, &expanded, len(recs))
		if !ok {
			continue // dropped
		}
		s.events += len(msgs)
		if err := s.add(ctx, i, rec, msgs); err != nil {
			s.stop, s.end = err, i
			break
		}
	}
	r.pubOnce.Do(func() { r.pub = newBatchPublisher(r.cfg.JS.Conn(), r.cfg.Names.ActivityStream()) })
	s.sent = r.pub.send(s.msgs, r.cfg.PublishTimeout)
	return s
}

// messagesOf makes the messages of one record (of queue's outbox, in a
// batch of records); false: the record does not decode, and is dropped.
func (r *Relay) messagesOf(queue string, rec taskstate.OutboxRecord, expanded *[]byte, records int) ([]pubMsg, bool) {
	switch outbox.FormOf(rec.Data) {
	case outbox.RecordBatch:
		return r.batchMessages(rec)
	case outbox.RecordMulti:
		// Each framed record is published as its own message, in order;
		// one that does not decode is dropped alone.
		frames, err := outbox.SplitMulti(rec.Data)
		if err != nil {
			r.drop("dropping undecodable outbox record", "stream_id", rec.StreamID, "event_id", rec.EventID, "err", err)
			return nil, false
		}
		msgs := make([]pubMsg, 0, len(frames))
		for _, f := range frames {
			m, err := r.single(queue, f.ID, f.Data, expanded, records*len(frames))
			if err != nil {
				r.drop("dropping undecodable record of an outbox multi-record", "stream_id", rec.StreamID, "event_id", f.ID, "err", err)
				continue
			}
			msgs = append(msgs, m)
		}
		return msgs, true
	}
	m, err := r.single(queue, rec.EventID, rec.Data, expanded, records)
	if err != nil {
		// Our own writers produced it, so this is a bug; keeping it
		// would block the outbox forever. Log loudly, count, drop.
		r.drop("dropping undecodable outbox record", "stream_id", rec.StreamID, "event_id", rec.EventID, "err", err)
		return nil, false
	}
	return []pubMsg{m}, true
}

// batchMessages makes the message of a batch record: published as it is,
// one message under the record's id, routed by its first event (a batch
// holds one queue's recoveries). A batch over what the server takes in one
// message goes as one message per event, each under its own id.
func (r *Relay) batchMessages(rec taskstate.OutboxRecord) ([]pubMsg, bool) {
	payload, _ := outbox.BatchEvents(rec.Data)
	var msgs []pubMsg
	var err error
	if max := r.cfg.JS.Conn().MaxPayload(); max > 0 && int64(len(payload))+batchHeaderBytes > max {
		msgs, err = r.splitBatch(payload)
	} else {
		var h envelopeHead
		h, err = batchHead(payload)
		h.ID = rec.EventID
		if err == nil {
			var subj string
			if subj, err = r.subjectOf(h); err == nil {
				msgs = []pubMsg{{subject: subj, msgID: h.ID, data: payload}}
			}
		}
	}
	if err != nil {
		r.drop("dropping undecodable outbox batch", "stream_id", rec.StreamID, "event_id", rec.EventID, "err", err)
		return nil, false
	}
	return msgs, true
}

// add queues msgs, the messages of recs[i], for publishing. A record older
// than half the duplicate window is looked up first: the stream may no
// longer remember an earlier publish of it (the window counts from that
// publish, which came after the record was written), and a message it
// holds is left out. An error of the lookup stops the batch at the record.
func (s *sending) add(ctx context.Context, i int, rec taskstate.OutboxRecord, msgs []pubMsg) error {
	r := s.r
	t, old := recordTime(rec.StreamID)
	old = old && r.cfg.Now().Sub(t) > r.cfg.DuplicateWindow/2
	for _, m := range msgs {
		if old {
			if s.seen == nil {
				s.seen = &publishedSince{}
			}
			found, err := s.seen.has(ctx, r.cfg.JS, r.cfg.Names.ActivityStream(), m.subject, t, m.msgID)
			if err != nil {
				return fmt.Errorf("check whether %s was published: %w", m.msgID, err)
			}
			if found {
				continue
			}
		}
		// s.at maps every message of a split batch or a multi-record to
		// its record: the record is done once all of them are stored.
		m.unconfirmed = s.mark
		s.msgs = append(s.msgs, m)
		s.at = append(s.at, i)
	}
	return nil
}

// single makes the message of one event's record (a JSON or a compact
// fired record) with id from queue's outbox. A compact record is expanded
// into *expanded, the batch's shared buffer (made for about records events
// on first use); the message's data is its slice, set before the buffer
// grows, so it stays valid.
func (r *Relay) single(queue, id string, data []byte, expanded *[]byte, records int) (pubMsg, error) {
	var h envelopeHead
	var err error
	switch form := outbox.FormOf(data); form {
	case outbox.RecordFired:
		if *expanded == nil {
			*expanded = make([]byte, 0, firedEventBytes*records)
		}
		var entry string
		from := len(*expanded)
		*expanded, entry, err = outbox.ExpandFiredRecord(*expanded, id, data, queue)
		data = (*expanded)[from:len(*expanded):len(*expanded)]
		h = envelopeHead{ID: id, Type: events.TypeEntryFired, Subject: entry}
	case outbox.RecordJSON, outbox.RecordUnknown:
		h, err = readHead(data)
	default:
		err = fmt.Errorf("a %s record is not one event's", form)
	}
	if err == nil && h.ID == "" {
		err = errors.New("event without an id")
	}
	if err != nil {
		return pubMsg{}, err
	}
	subj, err := r.subjectOf(h)
	if err != nil {
		return pubMsg{}, err
	}
	return pubMsg{subject: subj, msgID: h.ID, data: data}, nil
}

// batchHeaderBytes is room for a message's headers beside its data when a
// batch is held against the server's max_payload.
const batchHeaderBytes = 1024

// splitBatch returns the events of a batch as messages of their own.
func (r *Relay) splitBatch(payload []byte) ([]pubMsg, error) {
	parts, err := events.SplitEvents(payload)
	if err != nil {
		return nil, err
	}
	msgs := make([]pubMsg, 0, len(parts))
	for _, p := range parts {
		h, err := readHead(p)
		if err != nil || h.ID == "" {
			return nil, fmt.Errorf("event without a readable id: %v", err)
		}
		subj, err := r.subjectOf(h)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, pubMsg{subject: subj, msgID: h.ID, data: p})
	}
	return msgs, nil
}

// batchHead reads the head of a batch's first event.
func batchHead(payload []byte) (envelopeHead, error) {
	i := skipSpace(payload, 1)
	end, ok := skipValue(payload, i)
	if !ok || i >= len(payload) || payload[i] != '{' {
		return envelopeHead{}, errors.New("batch does not start with an event")
	}
	return readHead(payload[i:end])
}

// wait waits for the acknowledgements of a sent batch and returns how many
// of its leading records are safely in the stream, and the error that
// stopped the count.
func (s *sending) wait(ctx context.Context) (int, error) {
	stored, err := s.sent.wait(ctx)
	if s.mark != "" {
		s.r.countUnconfirmed(stored, s.mark)
	}
	for j := range s.msgs[:stored] {
		if s.msgs[j].dupSeq != 0 {
			s.r.checkDuplicate(ctx, s.r.cfg.Names.ActivityStream(), &s.msgs[j])
		}
	}
	if stored < len(s.msgs) {
		// Everything before the first message not stored is done.
		return s.at[stored], errors.Join(err, s.stop)
	}
	return s.end, errors.Join(err, s.stop)
}

// checkDuplicate compares the message the stream holds under m's id with
// m, after the stream dropped m as a duplicate. A republished record finds
// itself; anything else is a message someone else published first with the
// id of our event: the stream, whose duplicate window keeps the first,
// holds that forgery and not the genuine event. That is counted and logged;
// the record counts as published (publishing it again would be dropped
// again), and the tasks it describes are in Redis whatever the stream says.
func (r *Relay) checkDuplicate(ctx context.Context, stream string, m *pubMsg) {
	s, err := r.cfg.JS.Stream(ctx, stream)
	var stored *jetstream.RawStreamMsg
	if err == nil {
		stored, err = s.GetMsg(ctx, m.dupSeq)
	}
	if err != nil {
		r.log.Debug("read the message stored under a duplicate id", "id", m.msgID, "seq", m.dupSeq, "err", err)
		return
	}
	if stored.Subject == m.subject && stored.Header.Get(jetstream.MsgIDHeader) == m.msgID && bytes.Equal(stored.Data, m.data) {
		return
	}
	r.forgeries.Add(1)
	if mt := r.cfg.Metrics; mt != nil {
		mt.Forgeries.Inc()
	}
	// Whoever forged one event can forge them all: one warning a minute,
	// counting the others.
	r.mu.Lock()
	r.forgeriesSince++
	since := r.forgeriesSince
	warn := time.Since(r.forgeryLogged) >= time.Minute
	if warn {
		r.forgeryLogged, r.forgeriesSince = time.Now(), 0
	}
	r.mu.Unlock()
	if warn {
		r.log.Warn("the activity stream holds a different message under this event's id, published before it: a forgery; the genuine event was dropped as a duplicate (restrict who may publish on the activity subjects; counted in cronstream_relay_forgeries_total)",
			"id", m.msgID, "subject", m.subject, "forged_seq", m.dupSeq, "forged_subject", stored.Subject, "forgeries_since_last_warning", since)
	}
}

// publishedSince remembers, per subject, the event ids stored on it since a
// moment, for the records of one batch that are old enough for the stream
// to have forgotten them.
type publishedSince struct {
	subjects map[string]map[string]bool
}

// skew allows for the difference between Redis's clock (record times) and
// the NATS server's (message times).
const skew = time.Minute

// has reports whether event id is on subj, stored at or after the record's
// time. Every earlier publish of a record came after it was written, so that
// range holds it if anything does — however many records of the subject were
// published since, from however many outboxes.
func (p *publishedSince) has(ctx context.Context, js jetstream.JetStream, stream, subj string, at time.Time, id string) (bool, error) {
	if p.subjects == nil {
		p.subjects = map[string]map[string]bool{}
	}
	ids, ok := p.subjects[subj]
	if !ok {
		var err error
		if ids, err = storedIDs(ctx, js, stream, subj, at.Add(-skew)); err != nil {
			return false, err
		}
		p.subjects[subj] = ids
	}
	return ids[id], nil
}

// storedIDs reads the Nats-Msg-Id of every message on subj stored since.
func storedIDs(ctx context.Context, js jetstream.JetStream, stream, subj string, since time.Time) (map[string]bool, error) {
	ids := map[string]bool{}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ids, nil
	}
	if err != nil {
		return nil, err
	}
	if last.Time.Before(since) {
		return ids, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subj},
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		HeadersOnly:       true,
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	// One iterator, not a fetch per message: each fetch of an ordered
	// consumer replaces its consumer and deletes the one before, which no
	// role may (the server removes this one after its inactive threshold).
	it, err := c.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	for {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := it.Next(jetstream.NextContext(mctx))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read %s since %s: %w", subj, since.Format(time.RFC3339), err)
		}
		ids[m.Headers().Get(jetstream.MsgIDHeader)] = true
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		if md.Sequence.Stream >= last.Sequence || md.NumPending == 0 {
			return ids, nil
		}
	}
}

// recordTime reads when a record was written from its Redis Stream id
// (milliseconds-sequence).
func recordTime(streamID string) (time.Time, bool) {
	msPart, _, _ := strings.Cut(streamID, "-")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
