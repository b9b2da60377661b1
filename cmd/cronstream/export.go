package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/configsync"
	"github.com/cronstream/cronstream/events"
)

func init() { subcommands = append(subcommands, newExportCommand) }

// exportFlags are export's flags.
type exportFlags struct {
	conn   connFlags
	format string
	file   string
	owner  string
	// selector exports only the entries whose labels match.
	selector string
}

func newExportCommand(g *globalFlags) *cobra.Command {
	f := &exportFlags{}
	cmd := &cobra.Command{
		Use:   "export [--output-file FILE] [-o yaml|json|name] [--owner O] [--selector SEL]",
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
'team in (billing,ops)', tier!=batch, team, !team; commas join).

-o picks the output, as on every command: yaml (default: the schedules
file), json (the same document as JSON, which sync -f reads too) or name
(entry/<id>, one a line). --output-file writes it to a file instead of
stdout (atomically: an interrupted export leaves no half file). Earlier
builds took the file as -o FILE; that still works, with a warning, for
this release.`,
		Example: `  cronstream export --output-file schedules.yaml
  cronstream export --owner team-billing > billing.yaml
  cronstream export --selector team=payments --output-file payments.yaml
  cronstream export -o name --selector team=payments
  cronstream export | cronstream --prefix staging sync -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runExport(cmd, g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.format, "output", "o", "yaml", "output format: yaml (the schedules file), json or name")
	fl.StringVar(&f.file, "output-file", "", "write to this file instead of stdout")
	fl.StringVar(&f.owner, "owner", "", "export only the entries of this owner")
	addSelector(cmd, &f.selector, "export only the entries whose labels match", "")
	addConn(cmd, &f.conn, false)
	return cmd
}

// runExport writes the entries --owner and --selector keep in the format
// -o asks for, to stdout or --output-file.
func runExport(cmd *cobra.Command, g *globalFlags, f *exportFlags) error {
	ctx := cmd.Context()
	if err := f.resolveFormat(cmd); err != nil {
		return err
	}
	sel, err := parseSelector(f.selector)
	if err != nil {
		return err
	}
	s, err := openStreamsSession(ctx, g, &f.conn)
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
		if byOwner && c.Entry.Owner != f.owner || !sel.Matches(c.Entry.Labels) {
			continue
		}
		entries = append(entries, c.Entry)
	}
	var b bytes.Buffer
	if err := exportAs(&b, f.format, entries); err != nil {
		return err
	}
	if f.file == "" || f.file == "-" {
		_, err := cmd.OutOrStdout().Write(b.Bytes())
		return err
	}
	if err := writeFileAtomic(f.file, b.Bytes()); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "exported %s to %s\n", plural(len(entries), "entry", "entries"), terminalSafe(f.file))
	return nil
}

// resolveFormat checks -o. Earlier builds took the file as -o FILE: that
// is kept, with a warning, for a release.
func (f *exportFlags) resolveFormat(cmd *cobra.Command) error {
	switch f.format {
	case "yaml", "json", "name":
		return nil
	}
	if cmd.Flags().Changed("output-file") {
		return usagef("-o %q: use yaml, json or name (the file goes in --output-file)", f.format)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "cronstream: warning: export -o FILE is deprecated and goes in a later release: -o names the format (yaml, json, name), --output-file the file\n")
	f.file, f.format = f.format, "yaml"
	return nil
}

// exportAs writes entries in format: the schedules file as YAML or JSON,
// or their names.
func exportAs(w io.Writer, format string, entries []events.Entry) error {
	switch format {
	case "name":
		for _, e := range entries {
			fmt.Fprintf(w, "%s%s\n", namePrefix, e.ID)
		}
		return nil
	case "json":
		return exportJSON(w, entries)
	}
	return configsync.Export(w, entries)
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

// exportJSON writes the schedules file as JSON: the YAML document's keys
// and order, which sync -f reads as it reads YAML.
func exportJSON(w io.Writer, entries []events.Entry) error {
	var y bytes.Buffer
	if err := configsync.Export(&y, entries); err != nil {
		return err
	}
	var doc any
	if err := yaml.Unmarshal(y.Bytes(), &doc); err != nil {
		return fmt.Errorf("export as JSON: %w", err)
	}
	return printJSON(w, doc)
}
