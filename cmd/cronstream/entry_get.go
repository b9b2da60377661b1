package main

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

func init() { entryCommands = append(entryCommands, newEntryGetCommand) }

func newEntryGetCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one entry: every field, its revision and next fire",
		Long: `Show an entry as it is now: every field with defaults written out, its
revision (the stream sequence of its last message in the config stream,
what --if-revision expects: its last config event, or a later message that
changed nothing such as a refused fail-pause request), when that was
stored and when it fires next.`,
		Example: `  cronstream entry get report
  cronstream entry get report --json | jq .options.queue`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			e, rev, err := s.client.Get(ctx, args[0])
			if err != nil {
				return err
			}
			v := newEntryView(e.Normalize(), rev, s.revisionTime(ctx, rev), time.Now())
			if g.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			return printEntry(cmd.OutOrStdout(), v)
		},
	}
	cmd.Flags().BoolVar(&g.json, "json", false, "print the entry as JSON")
	addConn(cmd, &conn, false)
	return cmd
}

// revisionTime is when the config stream stored revision rev (zero when it
// cannot be read: the time is a courtesy, not worth failing for).
func (s *session) revisionTime(ctx context.Context, rev uint64) time.Time {
	st, err := s.js.Stream(ctx, s.names.ConfigStream())
	if err != nil {
		return time.Time{}
	}
	m, err := st.GetMsg(ctx, rev)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}
	}
	if m == nil {
		return time.Time{}
	}
	return m.Time
}
