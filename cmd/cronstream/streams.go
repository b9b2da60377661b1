package main

import (
	"context"
	"fmt"
	"io"
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

Replicas create them when they do not exist, but never change existing
ones: a replica whose --replicas or --activity-max-age differ from the
streams warns (in its log and in "cronstream status") and leaves them
as they are. "streams apply" is the one step that changes them.`,
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
differs in those is reported and left alone.`,
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
	changes, err := events.SyncStreams(ctx, s.js, cfg, mode)
	rep.Changes = append(rep.Changes, changes...)
	if err != nil {
		return rep, err
	}
	bucket := replica.ReplicasBucketConfig(s.names, cfg.Replicas, 3*replica.DefaultHeartbeat)
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
	for _, name := range []string{names.ConfigStream(), names.ActivityStream(), "KV_" + names.ReplicasBucket()} {
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
