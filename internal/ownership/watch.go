package ownership

import (
	"strings"
	"sync"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/clock"
)

// watchState follows the conditions that hold ownership back, so each is
// logged once when it begins and once when it ends, and readiness and the
// report can say since when (the loop writes it; Ready reads it).
type watchState struct {
	mu sync.Mutex
	// cut: cut off from NATS while another replica hears it.
	cut bool
	// hung: the scheduler's loop made no progress; not renewing.
	hung bool
	// unownedSince: since when shards this replica should own have had
	// no owner beyond a takeover's time (zero: none).
	unownedSince clock.Mono
	unowned      bool
	notLive      bool
	// readFail: since when the leases cannot be read, with the error.
	readFail clock.Mono
	readErr  string
}

func (w *watchState) cutOff(m *Manager, cut bool, hearer string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cut == w.cut {
		return
	}
	w.cut = cut
	if cut {
		m.log.Warn("cut off from NATS while another replica hears it: taking no shard and renewing none, so the replicas that hear NATS take them over",
			"not_heard_for_more_than", m.cfg.NATSLostAfter, "heard_by", hearer)
		return
	}
	m.log.Info("NATS heard again (or by no replica): shard leases renewed again")
}

func (w *watchState) stuck(m *Manager, hung bool, since time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if hung == w.hung {
		return
	}
	w.hung = hung
	if hung {
		m.log.Warn("the firing loop has made no progress: shard leases are not renewed, so other replicas take the shards over", "for", since.Round(time.Millisecond))
		return
	}
	m.log.Info("the firing loop makes progress again: shard leases renewed again")
}

// freshness logs shards without an owner and leases of replicas that are
// not live members when they begin and end.
func (w *watchState) freshness(m *Manager, unowned, mine []events.Shard, notLive map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case len(mine) > 0 && w.unownedSince.IsZero():
		w.unownedSince = m.clock.Mono()
	case len(mine) == 0:
		w.unownedSince = clock.Mono{}
	}
	if (len(unowned) > 0) != w.unowned {
		w.unowned = len(unowned) > 0
		if w.unowned {
			m.log.Warn("shards have no owner: nobody fires their entries until a replica takes them", "shards", len(unowned), "list", shardList(unowned), "of_this_replica", len(mine), "candidates", len(m.cands))
		} else {
			m.log.Info("every shard has an owner again")
		}
	}
	if (len(notLive) > 0) != w.notLive {
		w.notLive = len(notLive) > 0
		if w.notLive {
			var holders []string
			for h := range notLive {
				holders = append(holders, h)
			}
			m.log.Warn("shard leases held by replicas that are not live members (cut off from NATS, or another deployment on the same Redis and prefix)",
				"leases", sum(notLive), "holders", strings.Join(firstOf(uniq(holders), 8), ","))
		} else {
			m.log.Info("every shard lease is held by a live member again")
		}
	}
}

// problem says what holds this replica back, for the report.
func (w *watchState) problem() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var p []string
	if w.cut {
		p = append(p, "cut off from NATS while other replicas hear it: not renewing")
	}
	if w.hung {
		p = append(p, "firing loop not progressing: not renewing")
	}
	if w.readErr != "" {
		p = append(p, "cannot read leases: "+w.readErr)
	}
	return strings.Join(p, "; ")
}
