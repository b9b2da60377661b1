package replica

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/projector"
)

// catchupWarner logs one warning per entry whose catch-up window reaches
// back further than the activity stream keeps fired events (entries the
// CLI would refuse, written some other way, e.g. with the Go client):
// catch-up, backfill and watermark restores cannot check ticks beyond the
// retention against history. The heartbeat loop owns it; it looks again
// only when the projection or the stream's retention changed.
type catchupWarner struct {
	checkedSeq    uint64
	checkedMaxAge time.Duration
	// warned holds the window each warned entry had, so a changed window
	// warns again and a fixed entry is forgotten.
	warned map[string]events.Duration
}

func (w *catchupWarner) check(ctx context.Context, js jetstream.JetStream, names events.Names, proj *projector.Projector, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	maxAge, err := events.ActivityMaxAge(ctx, js, names)
	cancel()
	if err != nil {
		return // NATS unreachable: the next heartbeat looks again
	}
	seq := proj.LastSeq()
	if w.warned != nil && seq == w.checkedSeq && maxAge == w.checkedMaxAge {
		return
	}
	w.checkedSeq, w.checkedMaxAge = seq, maxAge
	still := map[string]events.Duration{}
	for _, st := range proj.Entries() {
		err := events.CatchupBeyondRetention(st.Entry, maxAge)
		if !errors.Is(err, events.ErrCatchupBeyondRetention) {
			continue
		}
		window := st.Entry.Catchup.Window
		still[st.Entry.ID] = window
		if prev, ok := w.warned[st.Entry.ID]; !ok || prev != window {
			log.Warn("ticks beyond the activity stream's retention cannot be checked against history: "+err.Error(),
				"entry", st.Entry.ID, "catchup_window", time.Duration(window).String(), "activity_max_age", maxAge.String())
		}
	}
	w.warned = still
}
