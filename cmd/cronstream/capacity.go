package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/forecast"
	"github.com/cronstream/cronstream/internal/replica"
)

// capacityWindow is how far ahead sync and entry put look for the
// schedule's busiest second.
const capacityWindow = 24 * time.Hour

// capacityReport is what sync and entry put say of the schedule after the
// change (docs/operations.md "Capacity"): its busiest second against what
// the live replicas have shown they can fire.
type capacityReport struct {
	// PeakPerSecond is the most ticks due in one second of the next
	// Window, at PeakAt.
	PeakPerSecond int64     `json:"peak_per_second"`
	PeakAt        time.Time `json:"peak_at,omitzero"`
	Window        string    `json:"window"`
	// Replicas are the live replicas; Shown those of them that have shown
	// a capacity, and CapacityPerSecond the sum of theirs.
	Replicas          int     `json:"replicas"`
	Shown             int     `json:"shown"`
	CapacityPerSecond float64 `json:"capacity_per_second"`
	// Exceeds: the busiest second holds more ticks than that sum.
	Exceeds bool `json:"exceeds"`
}

// liveCapacity reads the replicas' heartbeats: how many are live, how
// many of them have shown a capacity, and the sum of those.
func liveCapacity(ctx context.Context, s *session, now time.Time) (live, shown int, sum float64, err error) {
	infos, err := replica.ListReplicas(ctx, s.js, s.names)
	if err != nil {
		return 0, 0, 0, err
	}
	for _, info := range infos {
		if now.Sub(info.Beat) > info.StaleAfter() {
			continue
		}
		live++
		if info.FireCapacity > 0 {
			shown++
			sum += info.FireCapacity
		}
	}
	return live, shown, sum, nil
}

// checkCapacity compares the busiest second of entries (the schedule
// after a change) with what the live replicas have shown they can fire.
// It returns nil, reading no entry, when no live replica has shown a
// capacity: there is nothing to compare with (entries is only called
// then, as listing every entry costs a read of the config stream). The
// warning is "" unless the peak exceeds the capacity.
func checkCapacity(ctx context.Context, s *session, entries func() ([]events.Entry, error), now time.Time) (*capacityReport, string, error) {
	live, shown, sum, err := liveCapacity(ctx, s, now)
	if err != nil || shown == 0 {
		return nil, "", err
	}
	list, err := entries()
	if err != nil {
		return nil, "", err
	}
	pk := forecast.PeakSecond(slices.Values(entryPtrs(list)), forecast.Params{From: now, Window: capacityWindow})
	r := &capacityReport{PeakPerSecond: pk.Fires, PeakAt: pk.At, Window: shortDur(capacityWindow), Replicas: live, Shown: shown,
		CapacityPerSecond: sum, Exceeds: float64(pk.Fires) > sum}
	if !r.Exceeds {
		return r, "", nil
	}
	who := fmt.Sprintf("the %d live replicas have", live)
	if live == 1 {
		who = "the live replica has"
	}
	if shown < live {
		who = fmt.Sprintf("%d of the %d live replicas have (the others have not fired enough yet to tell)", shown, live)
	}
	return r, fmt.Sprintf("the schedule fires up to %s ticks in one second (%s UTC, the busiest second of the next %s), more than %s shown they can fire (about %s a second in all): ticks due in such seconds will fire late; add replicas, or spread the entries behind the peak with jitter (cronstream forecast shows them)",
		forecast.Thousands(pk.Fires), pk.At.UTC().Format("2006-01-02 15:04:05"), r.Window, who, forecast.Thousands(int64(sum))), nil
}

func entryPtrs(entries []events.Entry) []*events.Entry {
	out := make([]*events.Entry, len(entries))
	for i := range entries {
		out[i] = &entries[i]
	}
	return out
}

// scheduleAfter is the registered entries of current with plan's changes
// applied: what will fire once a sync is applied.
func scheduleAfter(current []events.Current, upserts []events.Entry, removes []string) []events.Entry {
	byID := map[string]events.Entry{}
	for _, c := range current {
		if c.Err == nil && !c.Entry.Removed {
			byID[c.ID] = c.Entry
		}
	}
	for _, e := range upserts {
		byID[e.ID] = e
	}
	for _, id := range removes {
		delete(byID, id)
	}
	return slices.Collect(maps.Values(byID))
}

// scheduleChanged reports whether an update from old to next changes when
// the entry fires.
func scheduleChanged(old, next events.Entry) bool {
	return old.Cron != next.Cron || old.Timezone != next.Timezone || old.Jitter != next.Jitter ||
		!old.StartAt.Equal(next.StartAt) || !old.EndAt.Equal(next.EndAt) || !slices.Equal(old.Exclude, next.Exclude) ||
		old.MaxFires != next.MaxFires || old.Paused != next.Paused
}

// shortDur writes whole hours and minutes without the zero parts ("24h").
func shortDur(d time.Duration) string {
	s := d.String()
	for _, z := range []string{"0s", "0m"} {
		if len(s) > len(z) && s[len(s)-len(z):] == z {
			s = s[:len(s)-len(z)]
		}
	}
	return s
}
