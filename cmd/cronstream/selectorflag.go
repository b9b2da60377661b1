package main

import "github.com/cronstream/cronstream/events"

// parseSelector parses a command's --selector (-l); a bad one is a usage
// error naming the flag, the same on every command.
func parseSelector(s string) (events.Selector, error) {
	sel, err := events.ParseSelector(s)
	if err != nil {
		return events.Selector{}, usagef("--selector: %v", err)
	}
	return sel, nil
}
