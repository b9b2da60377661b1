package main

import (
	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

// selectorSyntax is the label selector's syntax as every --selector's help
// gives it.
const selectorSyntax = "(k=v, k!=v, k in (a,b), k notin (a,b), k, !k; commas join)"

// addSelector registers --selector (-l) into dst: what says what it
// selects, then comes the syntax, then more.
func addSelector(cmd *cobra.Command, dst *string, what, more string) {
	cmd.Flags().StringVarP(dst, "selector", "l", "", what+" "+selectorSyntax+more)
}

// parseSelector parses a command's --selector (-l); a bad one is a usage
// error naming the flag, the same on every command.
func parseSelector(s string) (events.Selector, error) {
	sel, err := events.ParseSelector(s)
	if err != nil {
		return events.Selector{}, usagef("--selector: %v", err)
	}
	return sel, nil
}
