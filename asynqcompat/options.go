package asynqcompat

import (
	"errors"
	"fmt"
	"reflect"
	"time"
	"unsafe"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/asynqconv"
)

// ErrUnsupportedOption is matched (errors.Is) by the error of an asynq
// option a periodic entry cannot carry: TaskID, ProcessAt, ProcessIn, an
// absolute Deadline, or an option type asynq v0.26.0 does not have. The
// error names the option and says what to use instead.
var ErrUnsupportedOption = asynqconv.ErrUnsupportedOption

// ErrInvalidOption is matched by the error of an option whose value asynq
// itself refuses (a blank Queue or Group, a Unique TTL under a second) or
// that asynq would silently turn into none (a Timeout or Retention under a
// second).
var ErrInvalidOption = asynqconv.ErrInvalidOption

// optionTypeCronstream is the asynq.OptionType of this package's own
// options. asynq's composeOptions ignores option types it does not know, so
// one of them passed to asynq itself changes nothing there.
const optionTypeCronstream asynq.OptionType = 1 << 16

// Deadline gives each task of the entry a deadline d after its tick: a task
// fired for 09:00 with Deadline(time.Hour) must finish by 10:00 (the
// entry's options.deadline). asynq.Deadline, an absolute time, is refused:
// every task after that instant would fail at once.
func Deadline(d time.Duration) asynq.Option { return deadlineOption(d) }

type deadlineOption time.Duration

func (d deadlineOption) String() string {
	return fmt.Sprintf("%s(%v)", asynqconv.DeadlineName, time.Duration(d))
}
func (d deadlineOption) Type() asynq.OptionType { return optionTypeCronstream }
func (d deadlineOption) Value() any             { return time.Duration(d) }

// EntryID names the entry instead of the id derived from the registration
// (1-128 of A-Z a-z 0-9 _ -). A named entry keeps its id when its spec,
// task or options change: Register then updates it instead of registering
// another one.
func EntryID(id string) asynq.Option { return entryIDOption(id) }

type entryIDOption string

func (id entryIDOption) String() string         { return fmt.Sprintf("cronstream.EntryID(%q)", string(id)) }
func (id entryIDOption) Type() asynq.OptionType { return optionTypeCronstream }
func (id entryIDOption) Value() any             { return string(id) }

// Configure sets the entry's cronstream fields that asynq has no option for:
// catch-up, overlap, jitter, labels, exclusions, the active window,
// max_fires, pause_on_failure, tick_headers (docs/entries.md). f gets the
// entry as converted from the registration; it may not change the id, cron
// spec, timezone, task, asynq options, owner or pause state (Register
// refuses that). These fields are not part of the derived id: changing them
// updates the entry.
//
// A handler learns its task's entry and scheduled tick from the headers
// cronstream-entry and cronstream-scheduled-at, which each task carries
// when the entry has tick_headers (e.TickHeaders = true); the task's own
// headers may then not start with "cronstream-".
func Configure(f func(e *events.Entry)) asynq.Option { return configureOption{f} }

type configureOption struct{ f func(*events.Entry) }

func (configureOption) String() string         { return "cronstream.Configure(func)" }
func (configureOption) Type() asynq.OptionType { return optionTypeCronstream }
func (c configureOption) Value() any           { return c.f }

// registration is one Register call, split: the asynq options (as the
// strings asynqconv converts) and this package's own.
type registration struct {
	conv      asynqconv.Registration
	id        string
	configure []func(*events.Entry)
}

// newRegistration splits opts and reads the options given to NewTask,
// which asynq applies before those given to Register.
func newRegistration(cronspec string, task *asynq.Task, opts []asynq.Option) (registration, error) {
	if task == nil {
		return registration{}, errors.New("asynqcompat: task is nil")
	}
	taskOpts, err := taskOptions(task)
	if err != nil {
		return registration{}, err
	}
	r := registration{conv: asynqconv.Registration{Spec: cronspec, Type: task.Type(), Payload: task.Payload(), Headers: task.Headers()}}
	for _, o := range append(taskOpts, opts...) {
		switch o := o.(type) {
		case nil:
			return registration{}, errors.New("asynqcompat: nil option")
		case entryIDOption:
			r.id = string(o)
		case configureOption:
			if o.f != nil {
				r.configure = append(r.configure, o.f)
			}
		default:
			r.conv.Options = append(r.conv.Options, o.String())
		}
	}
	return r, nil
}

// taskOptions returns the options given to asynq.NewTask. asynq keeps them
// unexported and applies them at every enqueue before those given to
// Register, so a task built with asynq.NewTask("t", p, asynq.Queue("q"))
// enqueues into "q"; ignoring them would fire into another queue. asynq
// v0.26.0 holds them in Task.opts; a Task without that field (another asynq
// version) is refused rather than read wrongly.
func taskOptions(task *asynq.Task) ([]asynq.Option, error) {
	f := reflect.ValueOf(task).Elem().FieldByName("opts")
	if !f.IsValid() || f.Type() != reflect.TypeFor[[]asynq.Option]() {
		return nil, errors.New("asynqcompat: cannot read the options of this asynq.Task (built for asynq v0.26.0)")
	}
	opts := *(*[]asynq.Option)(unsafe.Pointer(f.UnsafeAddr()))
	return append([]asynq.Option(nil), opts...), nil
}
