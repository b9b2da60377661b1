package asynqconv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// ErrUnsupportedOption is wrapped by the error of an asynq option that a
// periodic entry cannot carry (TaskID, ProcessAt, ProcessIn, an absolute
// Deadline) or that asynq v0.26.0 does not have.
var ErrUnsupportedOption = errors.New("unsupported asynq option")

// ErrInvalidOption is wrapped by the error of an option whose value asynq
// itself refuses or cronstream cannot honour as given (a blank queue, a
// Unique TTL under a second).
var ErrInvalidOption = errors.New("invalid asynq option")

// OptionError names one option that does not convert and why.
type OptionError struct {
	Option string // the option's String() form, e.g. `TaskID("x")`
	Reason string
	err    error // ErrUnsupportedOption or ErrInvalidOption
}

func (e *OptionError) Error() string { return fmt.Sprintf("asynq option %s: %s", e.Option, e.Reason) }

// Unwrap makes errors.Is match ErrUnsupportedOption or ErrInvalidOption.
func (e *OptionError) Unwrap() error { return e.err }

// DeadlineName is the name of the relative deadline option's String()
// form, "cronstream.Deadline(1h0m0s)" (asynqcompat.Deadline): asynq's own
// Deadline is an absolute time, which a periodic entry cannot use.
const DeadlineName = "cronstream.Deadline"

// Option names as asynq v0.26.0's Option.String() writes them, one per
// OptionType (asynq's client.go).
const (
	optMaxRetry  = "MaxRetry"
	optQueue     = "Queue"
	optTimeout   = "Timeout"
	optDeadline  = "Deadline"
	optUnique    = "Unique"
	optProcessAt = "ProcessAt"
	optProcessIn = "ProcessIn"
	optTaskID    = "TaskID"
	optRetention = "Retention"
	optGroup     = "Group"
)

// ApplyOptions applies asynq options, given as their String() forms in the
// order asynq applies them (a later option of a kind wins, as in asynq's
// composeOptions), to the entry options o. Every option that does not
// convert is reported, each as an *OptionError; o is then unusable.
func ApplyOptions(o *contract.Options, opts []string) error {
	var errs []error
	for _, s := range opts {
		if err := applyOption(o, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applyOption applies one option's String() form.
func applyOption(o *contract.Options, s string) error {
	name, arg, ok := splitOption(s)
	if !ok {
		return unsupported(s, "not an asynq option (asynq writes options as Name(value))")
	}
	switch name {
	case optQueue:
		q, err := strconv.Unquote(arg)
		if err != nil {
			return invalid(s, "the queue name is not a quoted string")
		}
		if strings.TrimSpace(q) == "" {
			return invalid(s, "the queue name is blank (asynq refuses it too)")
		}
		o.Queue = q
	case optMaxRetry:
		n, err := strconv.Atoi(arg)
		if err != nil {
			return invalid(s, "the retry count is not a whole number")
		}
		n = max(n, 0) // asynq.MaxRetry treats a negative count as zero
		o.MaxRetry = &n
	case optTimeout:
		d, err := duration(s, arg, "the timeout", true)
		if err != nil {
			return err
		}
		o.Timeout = d
	case optUnique:
		d, err := duration(s, arg, "the Unique TTL", false)
		if err != nil {
			return err
		}
		if d == 0 {
			return invalid(s, "the Unique TTL must be at least 1s (asynq refuses it too)")
		}
		o.Unique = d
	case optRetention:
		d, err := duration(s, arg, "the retention", true)
		if err != nil {
			return err
		}
		o.Retention = d
	case optGroup:
		g, err := strconv.Unquote(arg)
		if err != nil {
			return invalid(s, "the group is not a quoted string")
		}
		if strings.TrimSpace(g) == "" {
			return invalid(s, "the group is blank (asynq refuses it too)")
		}
		o.Group = g
	case DeadlineName:
		d, err := duration(s, arg, "the deadline", false)
		if err != nil {
			return err
		}
		if d == 0 {
			return invalid(s, "the deadline must be at least 1s after the tick")
		}
		o.Deadline = d
	case optDeadline:
		return unsupported(s, "asynq.Deadline is an absolute time, after which every task of the entry would fail at once; "+
			"a cronstream deadline is relative to each tick (asynqcompat.Deadline(d), options.deadline in a schedules file)")
	case optTaskID:
		return unsupported(s, "cronstream gives each tick its own task id (<prefix>:<entry>:<tick>), so a tick can only ever be one task; "+
			"for one task at a time use overlap skip, for asynq's duplicate check Unique(ttl)")
	case optProcessAt, optProcessIn:
		return unsupported(s, "cronstream enqueues each tick when it is due; move the schedule instead (the cron spec, or jitter for a spread)")
	default:
		return unsupported(s, "not an option of asynq v0.26.0")
	}
	return nil
}

// splitOption splits "Name(arg)".
func splitOption(s string) (name, arg string, ok bool) {
	i := strings.IndexByte(s, '(')
	if i <= 0 || !strings.HasSuffix(s, ")") {
		return "", "", false
	}
	return s[:i], s[i+1 : len(s)-1], true
}

// duration reads a time.Duration.String() argument. Zero is accepted when
// zeroOK (asynq's "no limit" / "none"); otherwise, and for any positive
// value, it must be at least a second: asynq stores whole seconds, so a
// shorter one would silently become none.
func duration(s, arg, what string, zeroOK bool) (contract.Duration, error) {
	d, err := time.ParseDuration(arg)
	switch {
	case err != nil:
		return 0, invalid(s, what+" is not a duration")
	case d < 0:
		return 0, invalid(s, what+" is negative")
	case d == 0 && zeroOK:
		return 0, nil
	case d < time.Second:
		return 0, invalid(s, what+" is under one second: asynq stores whole seconds, so it would be none")
	}
	return contract.Duration(d), nil
}

func unsupported(opt, reason string) error {
	return &OptionError{Option: opt, Reason: reason, err: ErrUnsupportedOption}
}

func invalid(opt, reason string) error {
	return &OptionError{Option: opt, Reason: reason, err: ErrInvalidOption}
}

// OptionErrors lists the *OptionError leaves of an error from ApplyOptions
// or Registration.Entry.
func OptionErrors(err error) []*OptionError {
	var out []*OptionError
	var walk func(error)
	walk = func(err error) {
		if oe, ok := err.(*OptionError); ok {
			out = append(out, oe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}
