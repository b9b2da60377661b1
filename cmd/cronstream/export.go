package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
)

func init() { subcommands = append(subcommands, newExportCommand) }

func newExportCommand(g *globalFlags) *cobra.Command {
	var (
		conn  connFlags
		out   string
		owner string
		// selector exports only the entries whose labels match.
		selector string
	)
	cmd := &cobra.Command{
		Use:   "export [-o FILE] [--owner O]",
		Short: "Write the entries as a schedules file that sync -f reads",
		Long: `Write the registered entries as a schedules file (the format of sync -f),
every field written out, owner and pause state included. Syncing an export
publishes nothing; syncing it into an empty stream (another prefix, another
NATS) recreates the same entries.

Payloads keep their bytes: JSON as payload_json (its text as stored),
other text as payload, anything else (binary, control characters) as
payload_base64. An entry whose last config event cannot be applied
(quarantined) has no state to export: it is named on stderr and left out.

--owner exports only the entries of that owner (--owner "" : those without
one); --selector (-l) only those whose labels match (team=payments,
tier!=batch, team, !team; commas join).`,
		Example: `  cronstream export -o schedules.yaml
  cronstream export --owner team-billing > billing.yaml
  cronstream export --selector team=payments -o payments.yaml
  cronstream export | cronstream --prefix staging sync -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sel, err := events.ParseSelector(selector)
			if err != nil {
				return usagef("--selector: %v", err)
			}
			s, err := openStreamsSession(ctx, g, &conn)
			if err != nil {
				return err
			}
			defer s.Close()
			cur, err := s.client.List(ctx)
			if err != nil {
				return err
			}
			byOwner := cmd.Flags().Changed("owner")
			var entries []events.Entry
			for _, c := range cur {
				if c.Err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "left out %s: quarantined (%s)\n", terminalSafe(c.ID), terminalSafe(c.Err.Error()))
					continue
				}
				if byOwner && c.Entry.Owner != owner || !sel.Matches(c.Entry.Labels) {
					continue
				}
				entries = append(entries, c.Entry)
			}
			var b bytes.Buffer
			if err := configsync.Export(&b, entries); err != nil {
				return err
			}
			if out == "" || out == "-" {
				_, err := cmd.OutOrStdout().Write(b.Bytes())
				return err
			}
			if err := writeFileAtomic(out, b.Bytes()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "exported %s to %s\n", plural(len(entries), "entry", "entries"), terminalSafe(out))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "", "write to this file instead of stdout")
	f.StringVar(&owner, "owner", "", "export only the entries of this owner")
	f.StringVarP(&selector, "selector", "l", "", "export only the entries whose labels match (k=v, k!=v, k in (a,b), k notin (a,b), k, !k; commas join)")
	addConn(cmd, &conn, false)
	return cmd
}

// writeFileAtomic replaces path with data through a temporary file in the
// same directory, so an interrupted export never leaves half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
