package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// defaultMaxChanges is how many changes a command that changes several
// things makes without a terminal to ask on and without --yes: enough for
// a script's routine work (the compose file's sync --prune), not enough
// for a selector that matched more than was meant.
const defaultMaxChanges = 50

// errNothingChanged ends a command whose changes were not confirmed.
var errNothingChanged = errors.New("nothing changed")

// guardFlags are the guard rails of every command that creates, changes or
// removes more than one thing (backfill, sync --prune, pause, resume and
// rm of several entries): it shows what it will do and asks on a terminal;
// --yes goes ahead without asking, --dry-run only shows; without a
// terminal it refuses more than --max-changes changes unless --yes.
type guardFlags struct {
	yes, dryRun bool
	maxChanges  int
	// in and ask are the terminal the question goes to: stdin and stderr
	// (tests set them).
	in  io.Reader
	ask io.Writer
	tty bool
}

func (f *guardFlags) add(cmd *cobra.Command) {
	f.addConfirm(cmd)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "show what would change; change nothing")
}

// addConfirm registers --yes and --max-changes, for a command that has its
// own --dry-run.
func (f *guardFlags) addConfirm(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVarP(&f.yes, "yes", "y", false, "make the changes without asking (and beyond --max-changes)")
	fl.IntVar(&f.maxChanges, "max-changes", defaultMaxChanges, "without a terminal to ask on and without --yes, refuse to make more changes than this")
}

// confirm shows preview (when it will ask, or on --dry-run) and says
// whether n changes described as "verb n things" go ahead. One change goes
// ahead unasked. A change the user declines, or one refused without a
// terminal, is an error saying nothing changed; --dry-run returns false
// and no error.
func (f *guardFlags) confirm(cmd *cobra.Command, verb string, n int, one, many string, preview func(w io.Writer)) (bool, error) {
	if f.maxChanges < 0 {
		return false, usagef("--max-changes %d: give 0 or more", f.maxChanges)
	}
	out := cmd.OutOrStdout()
	if f.dryRun {
		preview(out)
		fmt.Fprintf(out, "dry run: would %s %s; nothing changed\n", verb, plural(n, one, many))
		return false, nil
	}
	if n <= 1 || f.yes {
		return n > 0, nil
	}
	in, ask, tty := f.terminal()
	if !tty {
		if n > f.maxChanges {
			return false, usagef("would %s %s, more than --max-changes %d, with no terminal to ask on: %v; pass --yes to go ahead (--dry-run shows them)",
				verb, plural(n, one, many), f.maxChanges, errNothingChanged)
		}
		return true, nil
	}
	preview(ask)
	fmt.Fprintf(ask, "%s %s? [y/N] ", capitalize(verb), plural(n, one, many))
	answer, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	return false, fmt.Errorf("not confirmed: %w", errNothingChanged)
}

// terminal is where confirm asks: stdin when it is a terminal, stderr for
// the question.
func (f *guardFlags) terminal() (io.Reader, io.Writer, bool) {
	if f.in != nil {
		return f.in, f.ask, f.tty
	}
	return os.Stdin, os.Stderr, isTerminal(os.Stdin) && isTerminal(os.Stderr)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// summarize lists at most max items and says how many more there are:
// messages about many things stay readable.
func summarize(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:max], ", "), len(items)-max)
}
