package contract

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cronstream/cronstream/internal/errtree"
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
	return errtree.Collect(err, func(fe *FieldError) string { return fe.Field })
}
