package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

func init() { entryCommands = append(entryCommands, newEntryGetCommand) }

func newEntryGetCommand(g *globalFlags) *cobra.Command {
	var conn connFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one entry: every field, its revision and next fire",
		Long: `Show an entry as it is now: every field with defaults written out, its
revision (the stream sequence of its last message in the config stream,
what --if-revision expects: its last config event, or a later message that
changed nothing such as a refused fail-pause request), when that was
stored and when it fires next.

-o picks the output: table (default: field by field), wide (the same),
json or yaml (the entry's state with revision, state and next fire), name
(entry/<id>).`,
		Example: `  cronstream entry get report
  cronstream entry get report -o yaml
  cronstream entry get report --json | jq .options.queue`,
		Args: entryIDArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			format, err := out.resolve(cmd)
			if err != nil {
				return err
			}
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
			if ok, err := printStructured(cmd.OutOrStdout(), format, v); ok {
				return err
			}
			if format == outName {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s%s\n", namePrefix, v.ID)
				return err
			}
			return printEntry(cmd.OutOrStdout(), v)
		},
	}
	addOutput(cmd, &out, outTable, outWide, outJSON, outYAML, outName)
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
