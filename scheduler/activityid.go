package scheduler

import (
	"strconv"
	"strings"
	"time"
)

// Event ids are derived from what they describe, so the same fact always
// has the same id (and the stream drops a republished one), and observers
// can read entry and tick off the Nats-Msg-Id header without decoding.
func firedEventID(entry string, tick time.Time) string {
	return "fire:" + entry + ":" + strconv.FormatInt(tick.Unix(), 10)
}

func skippedEventID(entry string, r tickRange) string {
	if r.Count <= 1 {
		return "skip:" + entry + ":" + strconv.FormatInt(r.Last.Unix(), 10)
	}
	return "skip:" + entry + ":" + strconv.FormatInt(r.First.Unix(), 10) + "-" + strconv.FormatInt(r.Last.Unix(), 10)
}

// ParseActivityID reads entry and last tick from a fired or skipped event
// id; ok is false for other ids (triggers, recoveries).
func ParseActivityID(id string) (entry string, tick time.Time, ok bool) {
	kind, rest, found := strings.Cut(id, ":")
	if !found || (kind != "fire" && kind != "skip") {
		return "", time.Time{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", time.Time{}, false
	}
	entry, ts := rest[:i], rest[i+1:]
	if strings.IndexByte(entry, ':') >= 0 {
		return "", time.Time{}, false // not an entry id: a trigger's record
	}
	if _, last, isRange := strings.Cut(ts, "-"); isRange {
		ts = last
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return entry, time.Unix(sec, 0).UTC(), true
}
