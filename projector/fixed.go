package projector

import (
	"context"
	"errors"
	"log/slog"

	"github.com/cronstream/cronstream/events"
)

// FromFold returns a projection of fold's entries that follows no stream:
// caught up at once, never changing, and readable like a live one (Get,
// Queues, Subscribe, Snapshot). It serves simulations and tools that fold
// events themselves: many schedulers may share it, as replicas share one
// config stream. The fold must not be changed afterwards; Start refuses,
// and Stop ends its subscriptions.
func FromFold(names events.Names, fold *Fold) (*Projector, error) {
	if fold == nil {
		return nil, errors.New("projector: FromFold needs a fold")
	}
	p := &Projector{
		names:   names,
		log:     slog.New(slog.DiscardHandler),
		hb:      DefaultHeartbeat,
		fold:    fold,
		subs:    make(map[*Subscription]struct{}),
		ready:   make(chan struct{}),
		stopped: make(chan struct{}),
	}
	// Started with nothing to run, so that Start refuses: there is
	// nothing to follow.
	if err := p.life.Start(context.Background(), func(context.Context) error { return nil }); err != nil {
		return nil, err
	}
	p.target = fold.LastSeq()
	p.markCaughtUpLocked()
	return p, nil
}
