package main

import (
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// Output formats of -o. Every read command takes -o with the same meaning,
// as kubectl's do: its human form (table, or text for one thing), wide
// where there are more columns to show, json and yaml with the same fields,
// and name where it lists things. --json stays as a short form of -o json.
const (
	outTable = "table"
	outWide  = "wide"
	outName  = "name"
	outJSON  = "json"
	outYAML  = "yaml"
)

// outputFlag is a read command's -o (and --json).
type outputFlag struct {
	format  string
	formats []string
	json    bool
}

// addOutput registers -o with formats (the first is the default) and
// --json; completion offers the formats.
func addOutput(cmd *cobra.Command, o *outputFlag, formats ...string) {
	o.formats = formats
	cmd.Flags().StringVarP(&o.format, "output", "o", formats[0], "output format: "+strings.Join(formats, ", "))
	cmd.Flags().BoolVar(&o.json, "json", false, "print as JSON (same as -o json)")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletions(formats))
}

// resolve returns the format -o and --json ask for, or a usage error.
func (o *outputFlag) resolve(cmd *cobra.Command) (string, error) {
	if !slices.Contains(o.formats, o.format) {
		return "", usagef("-o %q: use %s", o.format, strings.Join(o.formats, ", "))
	}
	if o.json {
		if cmd.Flags().Changed("output") && o.format != outJSON {
			return "", usagef("--json and -o %s: give one (--json is -o json)", o.format)
		}
		return outJSON, nil
	}
	return o.format, nil
}

// addJSONResult registers --json on a command that changes something
// (put, pause, resume, rm, trigger, backfill): its result as JSON instead
// of a line of text. Such commands take no -o.
func addJSONResult(cmd *cobra.Command, g *globalFlags) {
	cmd.Flags().BoolVar(&g.json, "json", false, "print the result as JSON")
}

// printStructured prints v as JSON or YAML (format), reporting whether it
// was one of those.
func printStructured(w io.Writer, format string, v any) (bool, error) {
	switch format {
	case outJSON:
		return true, printJSON(w, v)
	case outYAML:
		return true, printYAML(w, v)
	}
	return false, nil
}
