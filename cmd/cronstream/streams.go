package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/replica"
)

func init() { subcommands = append(subcommands, newStreamsCommand) }

func newStreamsCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "streams",
		Short: "Create or change the streams and the replicas bucket",
		Long: `Manage the JetStream streams of one tenant (--prefix): <PREFIX>_CONFIG,
<PREFIX>_ACTIVITY and the replicas KV bucket.

"streams apply" is the one step that creates and changes them, and the
only one that needs a NATS user that may (the streams role of
deploy/nats/permissions.conf). Replicas create what is missing only when
their NATS user may (development, a first start without permissions),
and never change existing streams: a replica whose --replicas or
--activity-max-age differ from the streams warns (in its log and in
"cronstream status") and leaves them as they are.`,
		Example: `  cronstream streams apply --replicas 3 --dry-run
  cronstream streams apply --replicas 3 --activity-max-age 2160h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newStreamsApplyCommand(g))
	return cmd
}

// streamsApplyReport is what `streams apply --json` prints.
type streamsApplyReport struct {
	DryRun  bool                  `json:"dry_run"`
	Changes []events.StreamChange `json:"changes"`
}

func newStreamsApplyCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var replicas int
	var activityMaxAge time.Duration
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Create or update the streams and the replicas bucket to these settings",
		Long: `Create the config stream, the activity stream and the replicas KV bucket,
or update them to the given settings, printing each difference
(old → new). With --dry-run, print the differences and change nothing.

Settings not given take their defaults (--replicas 1, --activity-max-age
720h), so give the settings of your deployment every time. Settings that
cannot work are refused before anything changes: an activity max age
below the activity stream's duplicate window (1h), replicas outside 1-5.
Stream subjects, storage and retention, and the config stream's audit
guarantees (no delete, no purge) are never changed: a stream that
differs in those is reported and left alone. Three changes of this kind
are made: a config stream made before fail-pause requests gets their
subjects, a replicas bucket kept in memory (earlier builds) is deleted
and made again on file (heartbeats are written again within a
heartbeat), and a replicas bucket that allows rollups (earlier builds)
is changed in place to refuse them and to write no marker when a
heartbeat expires: with a rollup, a replica's write on its own key
would remove every other replica's heartbeat.

Nothing is changed, and the command fails, when a stream or the bucket
can be written other than by a publish — a mirror, sources, a subject
transform or a republish on them, or another stream of the account that
republishes onto cronstream's subjects: configuration could come from
elsewhere than the operators. Remove it (nats stream edit) and apply
again.`,
		Example: `  cronstream streams apply --replicas 3 --dry-run
  cronstream streams apply --replicas 3 --activity-max-age 2160h
  cronstream streams apply --replicas 3 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names, err := g.names()
			if err != nil {
				return err
			}
			if replicas < 1 {
				return fmt.Errorf("--replicas %d: must be between 1 and 5", replicas)
			}
			if activityMaxAge <= 0 {
				return fmt.Errorf("--activity-max-age %s: must be positive", activityMaxAge)
			}
			cfg := events.StreamConfig{Names: names, Replicas: replicas, ActivityMaxAge: activityMaxAge}
			// Refuse impossible settings before connecting.
			if _, err := cfg.ActivityStreamConfig(); err != nil {
				return fmt.Errorf("impossible stream settings: %w", err)
			}
			s, err := openSession(g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			rep, err := applyStreams(cmd.Context(), s, cfg, dryRun)
			if g.json {
				if jerr := printJSON(cmd.OutOrStdout(), rep); jerr != nil && err == nil {
					err = jerr
				}
			} else {
				printStreamsApply(cmd.OutOrStdout(), s.names, rep, err == nil)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&replicas, "replicas", 1, "replicas of the streams and the bucket: 1 for development, 3 for production (R3)")
	f.DurationVar(&activityMaxAge, "activity-max-age", events.DefaultActivityMaxAge, "how long the activity stream keeps fire and recovery events")
	f.BoolVar(&dryRun, "dry-run", false, "print the differences, change nothing")
	f.BoolVar(&g.json, "json", false, "print the differences as one JSON object")
	addConn(cmd, &conn, false)
	return cmd
}

// applyStreams brings the streams, then the bucket, to cfg (or only
// compares, on a dry run). The report holds what was done before an error.
func applyStreams(ctx context.Context, s *session, cfg events.StreamConfig, dryRun bool) (streamsApplyReport, error) {
	mode := events.Apply
	if dryRun {
		mode = events.DryRun
	}
	rep := streamsApplyReport{DryRun: dryRun, Changes: []events.StreamChange{}}
	routes, err := events.RepublishInto(ctx, s.js, s.names)
	if err != nil {
		return rep, fmt.Errorf("look for streams that republish onto %s's subjects: %w", s.names.Prefix(), err)
	}
	if len(routes) > 0 {
		return rep, fmt.Errorf("refusing to apply: other streams republish onto cronstream's subjects, writing them other than by a publish (remove it: nats stream edit): %s", strings.Join(routes, "; "))
	}
	changes, err := events.SyncStreams(ctx, s.js, cfg, mode)
	rep.Changes = append(rep.Changes, changes...)
	if err != nil {
		return rep, err
	}
	bucket := replica.ReplicasBucketConfig(s.names, cfg.Replicas, replica.DefaultUnresponsiveFor)
	_, changes, err = replica.SyncReplicasBucket(ctx, s.js, bucket, mode)
	rep.Changes = append(rep.Changes, changes...)
	return rep, err
}

// printStreamsApply prints each difference and, when complete, what did
// not change.
func printStreamsApply(w io.Writer, names events.Names, rep streamsApplyReport, complete bool) {
	changed := map[string]bool{}
	for _, c := range rep.Changes {
		changed[c.Stream] = true
		fmt.Fprintln(w, c)
	}
	if !complete {
		return
	}
	for _, name := range []string{names.ConfigStream(), names.ActivityStream(), names.ReplicasStream()} {
		if !changed[name] {
			fmt.Fprintf(w, "%s: unchanged\n", name)
		}
	}
	switch {
	case rep.DryRun && len(rep.Changes) > 0:
		fmt.Fprintf(w, "dry run: %d difference(s), nothing changed\n", len(rep.Changes))
	case rep.DryRun:
		fmt.Fprintln(w, "dry run: nothing to change")
	case len(rep.Changes) > 0:
		fmt.Fprintf(w, "applied %d change(s)\n", len(rep.Changes))
	}
}
