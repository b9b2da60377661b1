package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/events"
)

// Shell completion beyond command and flag names: entry ids and queues
// read from the config stream, and the values of enum flags.

// entryIDCommands take an existing entry's id as their argument.
var entryIDCommands = []string{"get", "describe", "pause", "resume", "rm", "trigger", "backfill", "history"}

// completionWait bounds a completion's read of the config stream: a shell
// waiting on an unreachable NATS must get its prompt back.
const completionWait = 3 * time.Second

// addCompletions registers the completions on root's command tree.
func addCompletions(root *cobra.Command, g *globalFlags) {
	enums := map[string][]string{
		"catchup": {string(events.CatchupNone), string(events.CatchupLatest), string(events.CatchupAll)},
		"overlap": {string(events.OverlapAllow), string(events.OverlapSkip), string(events.OverlapBufferOne), string(events.OverlapCancelPrevious)},
		"state":   {stateActive, statePaused, stateEnded, stateCompleted, stateQuarantined},
	}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if p := cmd.Parent(); p != nil && p.Name() == "entry" && slices.Contains(entryIDCommands, cmd.Name()) {
			cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if len(args) > 0 {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return completeFromStream(cmd, g, toComplete, entryIDs)
			}
		}
		fl := cmd.Flags()
		for name, values := range enums {
			if fl.Lookup(name) != nil {
				_ = cmd.RegisterFlagCompletionFunc(name, fixedCompletions(values))
			}
		}
		if cmd.Name() == "audit" {
			_ = cmd.RegisterFlagCompletionFunc("type", completeEventTypes)
			if fl.Lookup("entry") != nil {
				_ = cmd.RegisterFlagCompletionFunc("entry", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
					return completeFromStream(cmd, g, toComplete, entryIDs)
				})
			}
		}
		if fl.Lookup("queue") != nil {
			_ = cmd.RegisterFlagCompletionFunc("queue", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				return completeFromStream(cmd, g, toComplete, entryQueues)
			})
		}
		if fl.Lookup("queues") != nil {
			_ = cmd.RegisterFlagCompletionFunc("queues", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				done, last := splitList(toComplete)
				out, dir := completeFromStream(cmd, g, last, entryQueues)
				return prefixAll(done, out), dir | cobra.ShellCompDirectiveNoSpace
			})
		}
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(root)
}

// fixedCompletions completes with those of values that start with what
// is typed.
func fixedCompletions(values []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		var out []string
		for _, v := range values {
			if strings.HasPrefix(v, toComplete) {
				out = append(out, v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// entryIDs and entryQueues pick what completes from the current entries.
func entryIDs(e events.Entry) string    { return e.ID }
func entryQueues(e events.Entry) string { return e.Options.QueueName() }

// completeFromStream completes toComplete with pick of each current entry
// of the config stream, connecting as the command would (its flags and
// CRONSTREAM_* variables). Any failure completes nothing: a completion has
// nowhere to report an error.
func completeFromStream(cmd *cobra.Command, g *globalFlags, toComplete string, pick func(events.Entry) string) ([]string, cobra.ShellCompDirective) {
	const dir = cobra.ShellCompDirectiveNoFileComp
	if err := applyEnv(cmd); err != nil {
		return nil, dir
	}
	var c connFlags
	fl := cmd.Flags()
	c.natsTLSCert, _ = fl.GetString("nats-tls-cert")
	c.natsTLSKey, _ = fl.GetString("nats-tls-key")
	c.natsTLSCA, _ = fl.GetString("nats-tls-ca")
	s, err := openSession(g, &c)
	if err != nil {
		return nil, dir
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), completionWait)
	defer cancel()
	cur, err := s.client.List(ctx)
	if err != nil {
		return nil, dir
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range cur {
		if e.Err != nil {
			continue
		}
		v := pick(e.Entry)
		if seen[v] || !strings.HasPrefix(v, toComplete) || !safeCompletion(v) {
			continue
		}
		seen[v] = true
		out = append(out, v)
	}
	slices.Sort(out)
	return out, dir
}

// safeCompletion keeps values a shell completion script can take as they
// are: no whitespace or control characters (ids with them must be typed).
func safeCompletion(v string) bool {
	return v != "" && !strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// completeEventTypes completes audit --type's last comma-separated element
// with the short event type names, described.
func completeEventTypes(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	done, last := splitList(toComplete)
	var out []string
	for _, ti := range events.Types {
		if short := events.ShortType(ti.Type); strings.HasPrefix(short, last) {
			out = append(out, done+short+"\t"+ti.Doc)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}

// splitList splits a comma-separated value being typed into the part
// already complete (with its trailing comma) and the element being typed.
func splitList(s string) (done, last string) {
	if i := strings.LastIndex(s, ","); i >= 0 {
		return s[:i+1], s[i+1:]
	}
	return "", s
}

func prefixAll(prefix string, vs []string) []string {
	for i := range vs {
		vs[i] = prefix + vs[i]
	}
	return vs
}
