package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/shardview"
)

// Status is one replica as `cronstream status` and the console's overview
// show it: its last heartbeat, that beat's age and whether it is ready.
// Both read it with ReadStatuses, so they show the same figures.
type Status struct {
	Info
	// BeatAge is how long before the reader's now the heartbeat was
	// written, to 100 ms. Beats are stamped on the replicas' clock
	// (corrected to Redis TIME), and readers pass a now on the same clock.
	BeatAge string `json:"beat_age"`
	// State is StateLive, or StateUnresponsive when its last beat is older
	// than three of its heartbeats (Info.StaleAfter): frozen, killed, or
	// cut off from NATS. The scheduler counts it out; the bucket drops it
	// DefaultUnresponsiveFor after its last beat.
	State string `json:"state"`
	// Ready is the replica's /readyz answer: "yes", "no: <failed checks>",
	// or "unknown" when its HTTP address cannot be reached from here.
	Ready string `json:"ready"`
}

// A replica's Status.State.
const (
	StateLive         = "live"
	StateUnresponsive = "unresponsive"
)

// ReadStatuses reads every heartbeat in the replicas bucket, sorted by id,
// and asks each live replica's /readyz at once, a second at most. Without
// a bucket the error wraps ErrNoReplicasBucket.
func ReadStatuses(ctx context.Context, js jetstream.JetStream, names events.Names, now time.Time) ([]Status, error) {
	infos, err := ListReplicas(ctx, js, names)
	if err != nil {
		return []Status{}, err
	}
	return readiness(ctx, infos, now), nil
}

// Members are the replicas of statuses as shardview.Collect reads them,
// so status and the console show the same shard figures.
func Members(statuses []Status) []shardview.Member {
	out := make([]shardview.Member, len(statuses))
	for i, s := range statuses {
		out[i] = shardview.Member{ID: s.ID, Shards: s.Shards, Report: s.Ownership}
	}
	return out
}

// beatClockSlack is how far after a reader's now a heartbeat may be
// stamped and still be shown as 0s old: more than two corrections to Redis
// TIME can disagree by.
const beatClockSlack = time.Second

// readiness asks each replica's /readyz, concurrently, with a short
// timeout: a replica behind a firewall is "unknown", not an error.
func readiness(ctx context.Context, infos []Info, now time.Time) []Status {
	out := make([]Status, len(infos))
	var wg sync.WaitGroup
	for i, info := range infos {
		age := now.Sub(info.Beat)
		if age < 0 && age > -beatClockSlack {
			// The beat's clock and now's are each corrected to Redis TIME
			// to within a round trip: a beat slightly after now is fresh.
			// One further ahead is shown as it is: a clock gone wrong.
			age = 0
		}
		out[i] = Status{Info: info, BeatAge: age.Round(100 * time.Millisecond).String(), State: StateLive, Ready: "unknown"}
		if age > info.StaleAfter() {
			// Its HTTP would not answer either (a frozen process holds the
			// connection): no need to ask.
			out[i].State = StateUnresponsive
			out[i].Ready = fmt.Sprintf("no: unresponsive, no beat for %s (live within %s of a beat; listed until %s after its last)",
				age.Round(time.Second), info.StaleAfter(), DefaultUnresponsiveFor)
			continue
		}
		if info.HTTP == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Ready = askReady(ctx, info)
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func askReady(ctx context.Context, info Info) string {
	host, port, err := net.SplitHostPort(info.HTTP)
	if err != nil {
		return "unknown"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = info.Host // listening on every interface: try the replica's host name
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		return "unknown"
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "unknown"
	}
	defer resp.Body.Close()
	var body struct {
		Ready  bool              `json:"ready"`
		Failed map[string]string `json:"failed"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) != nil {
		return "unknown"
	}
	if body.Ready {
		return "yes"
	}
	var why []string
	for _, k := range slices.Sorted(maps.Keys(body.Failed)) {
		why = append(why, k+": "+body.Failed[k])
	}
	return "no: " + strings.Join(why, "; ")
}
