package contract

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// validEntry is a small valid entry.
func validEntry(id string) Entry {
	return Entry{
		ID:   id,
		Cron: "*/5 * * * *",
		Task: Task{Type: "report:daily", Payload: []byte(`{"team":"ops"}`)},
	}
}

// fieldsOf returns the Field of every *FieldError in err's tree.
func fieldsOf(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if fe, ok := e.(*FieldError); ok {
			out = append(out, fe.Field)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}
