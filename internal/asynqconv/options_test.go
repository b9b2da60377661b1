package asynqconv

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/cronstream/cronstream/contract"
)

// Every option type asynq v0.26.0 has (its OptionType constants run from
// MaxRetryOpt to GroupOpt) either converts or is refused with an error
// naming it. The options are asynq's own, so their String() forms are the
// ones asynq writes into Redis.
func TestEveryAsynqOptionTypeConvertsOrIsRefused(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	retry := func(n int) *int { return &n }
	cases := []struct {
		opt     asynq.Option
		want    contract.Options // when it converts
		refused error            // when it does not: the sentinel
		reason  string
	}{
		{opt: asynq.MaxRetry(3), want: contract.Options{MaxRetry: retry(3)}},
		{opt: asynq.MaxRetry(-4), want: contract.Options{MaxRetry: retry(0)}},
		{opt: asynq.Queue("critical"), want: contract.Options{Queue: "critical"}},
		{opt: asynq.Queue(`we"ird q`), want: contract.Options{Queue: `we"ird q`}},
		{opt: asynq.Timeout(90 * time.Second), want: contract.Options{Timeout: contract.Duration(90 * time.Second)}},
		{opt: asynq.Timeout(0), want: contract.Options{}},
		{opt: asynq.Deadline(deadline), refused: ErrUnsupportedOption, reason: "absolute time"},
		{opt: asynq.Unique(time.Hour), want: contract.Options{Unique: contract.Duration(time.Hour)}},
		{opt: asynq.ProcessAt(deadline), refused: ErrUnsupportedOption, reason: "when it is due"},
		{opt: asynq.ProcessIn(time.Minute), refused: ErrUnsupportedOption, reason: "when it is due"},
		{opt: asynq.TaskID("fixed"), refused: ErrUnsupportedOption, reason: "its own task id"},
		{opt: asynq.Retention(24 * time.Hour), want: contract.Options{Retention: contract.Duration(24 * time.Hour)}},
		{opt: asynq.Group("batch"), want: contract.Options{Group: "batch"}},
		// Values asynq itself refuses at enqueue.
		{opt: asynq.Queue(" "), refused: ErrInvalidOption, reason: "blank"},
		{opt: asynq.Group(""), refused: ErrInvalidOption, reason: "blank"},
		{opt: asynq.Unique(500 * time.Millisecond), refused: ErrInvalidOption, reason: "under one second"},
		// Values asynq would silently turn into none.
		{opt: asynq.Retention(10 * time.Millisecond), refused: ErrInvalidOption, reason: "under one second"},
		{opt: asynq.Timeout(-time.Second), refused: ErrInvalidOption, reason: "negative"},
	}
	seen := map[asynq.OptionType]bool{}
	for _, c := range cases {
		seen[c.opt.Type()] = true
		t.Run(c.opt.String(), func(t *testing.T) {
			var got contract.Options
			err := ApplyOptions(&got, []string{c.opt.String()})
			if c.refused != nil {
				if !errors.Is(err, c.refused) {
					t.Fatalf("err = %v, want %v", err, c.refused)
				}
				if !strings.Contains(err.Error(), c.opt.String()) || !strings.Contains(err.Error(), c.reason) {
					t.Fatalf("error %q does not name the option %s and say %q", err, c.opt, c.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !optionsEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
	for typ := asynq.MaxRetryOpt; typ <= asynq.GroupOpt; typ++ {
		if !seen[typ] {
			t.Errorf("asynq option type %d has no case", typ)
		}
	}
}

func optionsEqual(a, b contract.Options) bool {
	if (a.MaxRetry == nil) != (b.MaxRetry == nil) || a.MaxRetry != nil && *a.MaxRetry != *b.MaxRetry {
		return false
	}
	a.MaxRetry, b.MaxRetry = nil, nil
	return a == b
}

func TestApplyOptions(t *testing.T) {
	t.Run("later wins", func(t *testing.T) {
		var o contract.Options
		err := ApplyOptions(&o, []string{`Queue("a")`, `MaxRetry(3)`, `Queue("b")`, `Timeout(1m0s)`, `Timeout(0s)`})
		if err != nil || o.Queue != "b" || *o.MaxRetry != 3 || o.Timeout != 0 {
			t.Fatalf("%+v %v", o, err)
		}
	})
	t.Run("relative deadline", func(t *testing.T) {
		var o contract.Options
		if err := ApplyOptions(&o, []string{DeadlineName + "(1h0m0s)"}); err != nil || o.Deadline != contract.Duration(time.Hour) {
			t.Fatalf("%+v %v", o, err)
		}
	})
	t.Run("every problem reported", func(t *testing.T) {
		var o contract.Options
		err := ApplyOptions(&o, []string{`TaskID("x")`, `Queue("ok")`, `ProcessIn(1m0s)`, `Frobnicate(1)`, `nonsense`})
		errs := OptionErrors(err)
		if len(errs) != 4 {
			t.Fatalf("%d option errors, want 4: %v", len(errs), err)
		}
		for i, want := range []string{`TaskID("x")`, `ProcessIn(1m0s)`, `Frobnicate(1)`, `nonsense`} {
			if errs[i].Option != want || !errors.Is(errs[i], ErrUnsupportedOption) {
				t.Errorf("error %d: %v, want one naming %s", i, errs[i], want)
			}
		}
	})
}

func TestSpec(t *testing.T) {
	for _, c := range []struct{ in, want, runs string }{
		{in: "*/5 * * * *", want: "*/5 * * * *"},
		{in: "  @daily ", want: "@daily"},
		{in: "@every 90s", want: "@every 90s"},
		{in: "@every 1500ms", runs: "@every 1s"},
		{in: "@every 200ms", runs: "@every 1s"},
		{in: "@every 2m30.5s", runs: "@every 2m30s"},
	} {
		got, err := Spec(c.in)
		var se *SpecError
		switch {
		case c.runs != "":
			if !errors.As(err, &se) || se.Runs != c.runs {
				t.Errorf("Spec(%q) = %q, %v; want a SpecError running %q", c.in, got, err, c.runs)
			}
		case err != nil || got != c.want:
			t.Errorf("Spec(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}
