package relay

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cronstream/cronstream/events"
	"github.com/cronstream/cronstream/internal/eventtest"
)

// FuzzReadHead: readHead agrees with encoding/json on every input that
// encoding/json accepts.
func FuzzReadHead(f *testing.F) {
	b := eventtest.MarshalAt(f, "fire:e:1", time.Unix(1, 0), events.TypeEntryFired, "cronstream/r", "e", events.Fired{Entry: "e", Queue: "q\"<>"})
	for _, seed := range []string{
		string(b),
		`{"data":{"x":[1,2,{"y":"}"}]},"subject":"s","type":"t","id":"i"}`,
		`{ "id" : "a\"b" , "type":"t","subject":"s"}`,
		`{"id":"i","type":"t"}`,
		`{"x":null,"y":true,"z":-1.5e3,"id":"i","type":"t","subject":"s"}`,
		`{}`, `[]`, `"x"`, `{"id":1}`, `{"id":"i",}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want envelopeHead
		werr := json.Unmarshal(data, &want)
		got, gerr := readHead(data)
		if werr != nil || repeatsName(data) {
			return // readHead may read more leniently; the relay then drops on an empty id
		}
		if gerr != nil || got != want {
			t.Fatalf("readHead(%q) = %+v, %v; encoding/json %+v", data, got, gerr, want)
		}
	})
}

// repeatsName reports whether the top-level object repeats a name (up to
// case), where encoding/json takes the last and readHead the first.
func repeatsName(data []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return false
		}
		key := strings.ToLower(k.(string))
		if seen[key] {
			return true
		}
		seen[key] = true
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}
