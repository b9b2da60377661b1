package configsync

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/events"
)

// Export writes entries as a schedules file that Parse reads back into the
// same entries, owner and pause state included: syncing an export changes
// nothing, and syncing it into an empty stream recreates the entries.
// Removed entries are left out. Every field of events.Entry is written
// (the export round-trip test fails when Entry grows one this misses).
func Export(w io.Writer, entries []events.Entry) error {
	return export(w, entries, false)
}

// ExportUnowned is Export without the owner and pause state, for entries
// that come from elsewhere (cronstream import): the sync that reads the
// file gives them its owner, and keeps the pause state of entries that
// exist.
func ExportUnowned(w io.Writer, entries []events.Entry) error {
	return export(w, entries, true)
}

func export(w io.Writer, entries []events.Entry, unowned bool) error {
	list := &yaml.Node{Kind: yaml.SequenceNode}
	for _, e := range entries {
		if e.Removed {
			continue
		}
		n := entryNode(e.Normalize())
		if unowned {
			dropKeys(n, "owner", "paused")
		}
		list.Content = append(list.Content, n)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(mapping("entries", list)); err != nil {
		return fmt.Errorf("write schedules file: %w", err)
	}
	return enc.Close()
}

// entryNode is the entry as the parser reads it, fields in the order
// people read. Paused and owner are always written: an export says the
// pause state and the owner (empty: none) rather than leaving them to the
// sync.
func entryNode(e events.Entry) *yaml.Node {
	task := mapping("type", str(e.Task.Type))
	switch p := e.Task.Payload; {
	case len(p) == 0:
	case utf8.Valid(p) && json.Valid(p):
		task.Content = append(task.Content, str("payload_json"), str(string(p)))
	case isPlainText(p):
		task.Content = append(task.Content, str("payload"), str(string(p)))
	default:
		task.Content = append(task.Content, str("payload_base64"), str(base64.StdEncoding.EncodeToString(p)))
	}
	if len(e.Task.Headers) > 0 {
		h := mapping()
		for _, k := range slices.Sorted(maps.Keys(e.Task.Headers)) {
			h.Content = append(h.Content, str(k), str(e.Task.Headers[k]))
		}
		task.Content = append(task.Content, str("headers"), h)
	}
	o := mapping()
	add(o, "queue", str(e.Options.Queue))
	if e.Options.MaxRetry != nil {
		add(o, "max_retry", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(*e.Options.MaxRetry)})
	}
	add(o, "timeout", dur(e.Options.Timeout))
	add(o, "deadline", dur(e.Options.Deadline))
	add(o, "unique", dur(e.Options.Unique))
	add(o, "retention", dur(e.Options.Retention))
	add(o, "group", str(e.Options.Group))
	c := mapping()
	add(c, "policy", str(string(e.Catchup.Policy)))
	add(c, "window", dur(e.Catchup.Window))

	n := mapping("id", str(e.ID), "cron", str(e.Cron))
	add(n, "timezone", str(e.Timezone))
	n.Content = append(n.Content, str("task"), task)
	if len(o.Content) > 0 {
		n.Content = append(n.Content, str("options"), o)
	}
	if len(c.Content) > 0 {
		n.Content = append(n.Content, str("catchup"), c)
	}
	add(n, "overlap", str(string(e.Overlap)))
	add(n, "jitter", dur(e.Jitter))
	n.Content = append(n.Content, str("paused"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(e.Paused)})
	add(n, "note", str(e.Note))
	if e.PauseOnFailure {
		n.Content = append(n.Content, str("pause_on_failure"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
	if e.TickHeaders {
		n.Content = append(n.Content, str("tick_headers"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
	n.Content = append(n.Content, str("owner"), str(e.Owner))
	if !e.StartAt.IsZero() {
		n.Content = append(n.Content, str("start_at"), str(e.StartAt.UTC().Format(time.RFC3339)))
	}
	if !e.EndAt.IsZero() {
		n.Content = append(n.Content, str("end_at"), str(e.EndAt.UTC().Format(time.RFC3339)))
	}
	if len(e.Exclude) > 0 {
		x := &yaml.Node{Kind: yaml.SequenceNode}
		for _, spec := range e.Exclude {
			x.Content = append(x.Content, str(spec))
		}
		n.Content = append(n.Content, str("exclude"), x)
	}
	if e.MaxFires > 0 {
		n.Content = append(n.Content, str("max_fires"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(e.MaxFires)})
	}
	if len(e.Labels) > 0 {
		l := mapping()
		for _, k := range slices.Sorted(maps.Keys(e.Labels)) {
			l.Content = append(l.Content, str(k), str(e.Labels[k]))
		}
		n.Content = append(n.Content, str("labels"), l)
	}
	return n
}

// dropKeys removes keys from mapping node m.
func dropKeys(m *yaml.Node, keys ...string) {
	out := m.Content[:0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if !slices.Contains(keys, m.Content[i].Value) {
			out = append(out, m.Content[i], m.Content[i+1])
		}
	}
	m.Content = out
}

// mapping makes a mapping node of key, value pairs (strings as keys,
// nodes as values).
func mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode}
	for _, x := range kv {
		switch v := x.(type) {
		case string:
			m.Content = append(m.Content, str(v))
		case *yaml.Node:
			m.Content = append(m.Content, v)
		}
	}
	return m
}

// add appends key: v unless v is an empty string.
func add(m *yaml.Node, key string, v *yaml.Node) {
	if v.Kind == yaml.ScalarNode && v.Value == "" {
		return
	}
	m.Content = append(m.Content, str(key), v)
}

// str is a string scalar. One holding anything but printable characters
// is double-quoted, the style that escapes them: the block styles yaml.v3
// would choose otherwise can produce text it does not read back (a tab
// after a line break).
func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	for _, r := range s {
		if !unicode.IsPrint(r) && r != ' ' {
			n.Style = yaml.DoubleQuotedStyle
			break
		}
	}
	return n
}

func dur(d events.Duration) *yaml.Node {
	if d == 0 {
		return str("")
	}
	return str(d.String())
}

// isPlainText reports whether a payload reads as text in a YAML string:
// valid UTF-8 without control characters (a newline or tab would survive
// YAML, but base64 says plainly that the bytes matter).
func isPlainText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) || r == utf8.RuneError || r == '\uFEFF' {
			return false
		}
	}
	return true
}
