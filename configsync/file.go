package configsync

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cronstream/cronstream/events"
)

// Config is one entry as a schedules file or a ConfigProvider wants it.
type Config struct {
	// Entry is the wanted state. Its Paused, Owner and Removed fields are
	// ignored: Paused and Owner below say those.
	Entry events.Entry
	// Paused, when set, is the pause state to enforce. Nil keeps the
	// entry's current pause state (and a pause note), so an entry paused
	// with `cronstream entry pause` stays paused across syncs.
	Paused *bool
	// Owner, when set, is the entry's owner label (empty: no owner), as an
	// export writes it. Nil gives the entry the sync's owner.
	Owner *string
}

// ErrInvalidConfig is wrapped by every *InvalidError.
var ErrInvalidConfig = errors.New("invalid config")

// Problem is one thing wrong with a schedules file or a provider's configs.
type Problem struct {
	// Entry is the entry's id, or "entries[i]" when it has none.
	Entry string
	// Field is the entry state's field ("options.timeout"), empty for the
	// entry or the file as a whole.
	Field string
	// Line is the line in the file (0 when unknown or not from a file).
	Line    int
	Message string

	index int // position of the entry in the list, -1 for the file
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Entry != "" {
		b.WriteString("entry " + p.Entry)
	} else {
		b.WriteString("file")
	}
	if p.Field != "" {
		b.WriteString(": " + p.Field)
	}
	if p.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", p.Line)
	}
	b.WriteString(": " + p.Message)
	return b.String()
}

// InvalidError lists every problem found in a set of configs; nothing of
// it may be applied.
type InvalidError struct {
	Source   string
	Problems []Problem
}

func (e *InvalidError) Error() string {
	var b strings.Builder
	n := len(e.Problems)
	fmt.Fprintf(&b, "%s is invalid (%d problem", e.Source, n)
	if n != 1 {
		b.WriteString("s")
	}
	b.WriteString("):")
	for _, p := range e.Problems {
		b.WriteString("\n  - " + p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *InvalidError) Unwrap() error { return ErrInvalidConfig }

// Load reads and validates a schedules file (YAML, or JSON with the same
// fields).
func Load(path string) ([]Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read schedules file: %w", err)
	}
	return Parse(b, path)
}

// Parse reads and validates a schedules file's content; source names it in
// errors. Every problem is reported, each with its entry and field: unknown
// fields (typo protection), values of the wrong kind, entries that fail
// validation, and ids given twice.
func Parse(data []byte, source string) ([]Config, error) {
	p := &parser{source: source, index: -1}
	cfgs := p.parse(data)
	// Validation runs on what parsed, so one pass lists every problem; a
	// field that already failed to parse is not reported again.
	type key struct {
		index int
		field string
	}
	reported := map[key]bool{}
	for _, pr := range p.problems {
		reported[key{pr.index, pr.Field}] = true
	}
	for _, pr := range validate(cfgs, p.lines) {
		if reported[key{pr.index, pr.Field}] {
			continue
		}
		if l, ok := p.fieldLine[fieldKey(pr.index, pr.Field)]; ok {
			pr.Line = l
		}
		p.problems = append(p.problems, pr)
	}
	slices.SortStableFunc(p.problems, func(a, b Problem) int { return a.Line - b.Line })
	if len(p.problems) > 0 {
		return nil, &InvalidError{Source: source, Problems: p.problems}
	}
	return cfgs, nil
}

// Validate checks configs as a sync would before publishing anything:
// every entry must pass validation and ids must be unique.
func Validate(cfgs []Config) error {
	if ps := validate(cfgs, nil); len(ps) > 0 {
		return &InvalidError{Source: "configs", Problems: ps}
	}
	return nil
}

func validate(cfgs []Config, lines []int) []Problem {
	var out []Problem
	seen := map[string]int{}
	for i, c := range cfgs {
		line := 0
		if i < len(lines) {
			line = lines[i]
		}
		name := c.Entry.ID
		if name == "" || events.ValidateID(name) != nil {
			name = fmt.Sprintf("entries[%d]", i)
		}
		e := c.Entry
		e.Owner, e.Removed = "", false
		if c.Owner != nil {
			e.Owner = *c.Owner
		}
		if c.Paused != nil {
			e.Paused = *c.Paused
		}
		for _, fe := range fieldErrors(e.Validate()) {
			msg := fe.Reason
			if fe.Value != "" {
				msg = fmt.Sprintf("%q: %s", fe.Value, fe.Reason)
			}
			out = append(out, Problem{Entry: name, Field: fe.Field, Line: line, Message: msg, index: i})
		}
		if c.Entry.ID != "" {
			if first, dup := seen[c.Entry.ID]; dup {
				out = append(out, Problem{Entry: name, Line: line, Message: fmt.Sprintf("id given twice (also entries[%d])", first), index: i})
			} else {
				seen[c.Entry.ID] = i
			}
		}
	}
	return out
}

// fieldErrors collects the *events.FieldError leaves of a validation error
// (a tree of wrapped and joined errors).
func fieldErrors(err error) []*events.FieldError {
	if err == nil {
		return nil
	}
	if fe, ok := err.(*events.FieldError); ok {
		return []*events.FieldError{fe}
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		var out []*events.FieldError
		for _, e := range u.Unwrap() {
			out = append(out, fieldErrors(e)...)
		}
		return out
	case interface{ Unwrap() error }:
		return fieldErrors(u.Unwrap())
	}
	return []*events.FieldError{{Field: "entry", Reason: err.Error()}}
}

// FieldErrors returns the field errors inside an error from
// events.Entry.Validate (or a write that failed validation), so callers can
// show each problem with its field.
func FieldErrors(err error) []*events.FieldError {
	if !errors.Is(err, events.ErrInvalidEntry) {
		return nil
	}
	return fieldErrors(err)
}

// parser walks the YAML node tree by hand rather than decoding into
// structs: that is what lets it name the entry, field and line of every
// problem, and report them all at once.
type parser struct {
	source   string
	problems []Problem
	lines    []int // line of each entry
	entry    string
	index    int // of the entry being parsed, -1 outside entries
	// fieldLine is the line of each field's value, by entry and field, so
	// validation problems point at their line too.
	fieldLine map[string]int
}

func fieldKey(index int, field string) string { return fmt.Sprintf("%d\x00%s", index, field) }

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.problems = append(p.problems, Problem{Entry: p.entry, Field: field, Line: line, Message: fmt.Sprintf(format, args...), index: p.index})
}

func (p *parser) parse(data []byte) []Config {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.fail(nil, "", "empty: a schedules file needs an \"entries\" list (write \"entries: []\" to mean none)")
		} else {
			p.fail(nil, "", "not valid YAML or JSON: %v", err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.fail(&extra, "", "more than one YAML document; put every entry in one \"entries\" list")
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		p.fail(root, "", "the top level must be a mapping with an \"entries\" list")
		return nil
	}
	var list *yaml.Node
	p.fields(root, "", func(key string, v *yaml.Node) bool {
		if key != "entries" {
			return false
		}
		list = v
		return true
	})
	if list == nil {
		if len(p.problems) == 0 {
			p.fail(root, "", "missing \"entries\" (write \"entries: []\" to mean none)")
		}
		return nil
	}
	if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		p.fail(list, "", "\"entries\" is empty: write \"entries: []\" to mean none")
		return nil
	}
	if list.Kind != yaml.SequenceNode {
		p.fail(list, "", "\"entries\" must be a list")
		return nil
	}
	out := make([]Config, 0, len(list.Content))
	for i, n := range list.Content {
		p.entry, p.index = fmt.Sprintf("entries[%d]", i), i
		if n.Kind == yaml.MappingNode {
			for j := 0; j+1 < len(n.Content); j += 2 {
				if n.Content[j].Value == "id" && n.Content[j+1].Kind == yaml.ScalarNode && events.ValidateID(n.Content[j+1].Value) == nil {
					p.entry = n.Content[j+1].Value
				}
			}
		}
		out = append(out, p.entryNode(n))
		p.lines = append(p.lines, n.Line)
	}
	p.entry, p.index = "", -1
	return out
}

// fields calls f for each key of mapping n; f reports whether it knows the
// key. Unknown and repeated keys are problems.
func (p *parser) fields(n *yaml.Node, path string, f func(key string, v *yaml.Node) bool) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := path + k.Value
		if k.Kind != yaml.ScalarNode {
			p.fail(k, path, "keys must be plain names")
			continue
		}
		if seen[k.Value] {
			p.fail(k, name, "given twice")
			continue
		}
		seen[k.Value] = true
		if p.fieldLine == nil {
			p.fieldLine = map[string]int{}
		}
		p.fieldLine[fieldKey(p.index, name)] = v.Line
		if !f(k.Value, v) {
			p.fail(k, name, "unknown field%s", hint(k.Value))
		}
	}
}

// hint suggests the field a typo probably meant.
func hint(key string) string {
	switch key {
	case "removed":
		return " (leave the entry out of the file and sync with --prune)"
	case "queue", "max_retry", "timeout", "deadline", "unique", "retention", "group":
		return fmt.Sprintf(" (it belongs under options: options: {%s: ...})", key)
	case "type", "payload", "headers":
		return fmt.Sprintf(" (it belongs under task: task: {%s: ...})", key)
	case "spec", "schedule", "cronspec":
		return " (did you mean cron?)"
	case "tz", "location":
		return " (did you mean timezone?)"
	}
	return ""
}

func (p *parser) entryNode(n *yaml.Node) Config {
	var c Config
	if n.Kind != yaml.MappingNode {
		p.fail(n, "", "an entry must be a mapping with at least id, cron and task.type")
		return c
	}
	e := &c.Entry
	p.fields(n, "", func(key string, v *yaml.Node) bool {
		switch key {
		case "id":
			e.ID = p.str(v, key)
		case "cron":
			e.Cron = p.str(v, key)
		case "timezone":
			e.Timezone = p.str(v, key)
		case "task":
			p.task(v, &e.Task)
		case "options":
			p.options(v, &e.Options)
		case "catchup":
			if !p.mapping(v, key) {
				return true
			}
			p.fields(v, "catchup.", func(key string, v *yaml.Node) bool {
				switch key {
				case "policy":
					e.Catchup.Policy = events.CatchupPolicy(p.str(v, "catchup.policy"))
				case "window":
					e.Catchup.Window = p.dur(v, "catchup.window")
				default:
					return false
				}
				return true
			})
		case "overlap":
			e.Overlap = events.OverlapPolicy(p.str(v, key))
		case "jitter":
			e.Jitter = p.dur(v, key)
		case "paused":
			if b, ok := p.boolean(v, key); ok {
				c.Paused = &b
			}
		case "note":
			e.Note = p.str(v, key)
		case "pause_on_failure":
			e.PauseOnFailure, _ = p.boolean(v, key)
		case "tick_headers":
			e.TickHeaders, _ = p.boolean(v, key)
		case "owner":
			o := p.str(v, key)
			c.Owner = &o
		case "start_at":
			e.StartAt = p.time(v, key)
		case "end_at":
			e.EndAt = p.time(v, key)
		case "exclude":
			e.Exclude = p.strList(v, key)
		case "max_fires":
			if isNull(v) {
				return true
			}
			n, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || n < 1 {
				p.fail(v, key, "must be a whole number of at least 1 (leave it out for no limit), got %q", v.Value)
				return true
			}
			e.MaxFires = n
		case "labels":
			if isNull(v) || !p.mapping(v, key) {
				return true
			}
			e.Labels = map[string]string{}
			p.fields(v, "labels.", func(key string, lv *yaml.Node) bool {
				e.Labels[key] = p.str(lv, "labels."+key)
				return true
			})
		default:
			return false
		}
		return true
	})
	return c
}

// time is an RFC 3339 time ("2027-03-01T09:00:00Z") or a date
// ("2027-03-01", midnight UTC), however YAML tagged it.
func (p *parser) time(n *yaml.Node, field string) time.Time {
	s := p.str(n, field)
	if s == "" {
		return time.Time{}
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	p.fail(n, field, "%q: use RFC 3339 (2027-03-01T09:00:00Z) or a date (2027-03-01, UTC)", s)
	return time.Time{}
}

// strList is a list of strings; a single string is a list of one.
func (p *parser) strList(n *yaml.Node, field string) []string {
	switch {
	case isNull(n):
		return nil
	case n.Kind == yaml.ScalarNode:
		return []string{n.Value}
	case n.Kind != yaml.SequenceNode:
		p.fail(n, field, "must be a list of strings")
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for _, c := range n.Content {
		out = append(out, p.str(c, field))
	}
	return out
}

func (p *parser) task(n *yaml.Node, t *events.Task) {
	if !p.mapping(n, "task") {
		return
	}
	var payloadKey string
	setPayload := func(k *yaml.Node, key string, b []byte) {
		if payloadKey != "" {
			p.fail(k, "task."+key, "give one of payload, payload_json and payload_base64 (%s is given too)", payloadKey)
			return
		}
		payloadKey, t.Payload = key, b
	}
	p.fields(n, "task.", func(key string, v *yaml.Node) bool {
		switch key {
		case "type":
			t.Type = p.str(v, "task.type")
		case "payload":
			setPayload(v, key, p.payload(v))
		case "payload_json":
			setPayload(v, key, p.payloadJSON(v))
		case "payload_base64":
			setPayload(v, key, p.payloadBase64(v))
		case "headers":
			if isNull(v) {
				return true
			}
			if !p.mapping(v, "task.headers") {
				return true
			}
			t.Headers = map[string]string{}
			p.fields(v, "task.headers.", func(key string, hv *yaml.Node) bool {
				t.Headers[key] = p.str(hv, "task.headers."+key)
				return true
			})
		default:
			return false
		}
		return true
	})
}

func (p *parser) options(n *yaml.Node, o *events.Options) {
	if !p.mapping(n, "options") {
		return
	}
	p.fields(n, "options.", func(key string, v *yaml.Node) bool {
		field := "options." + key
		switch key {
		case "queue":
			o.Queue = p.str(v, field)
		case "max_retry":
			if isNull(v) {
				return true
			}
			r, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				p.fail(v, field, "must be a whole number, got %q", v.Value)
				return true
			}
			o.MaxRetry = &r
		case "timeout":
			o.Timeout = p.dur(v, field)
		case "deadline":
			o.Deadline = p.dur(v, field)
		case "unique":
			o.Unique = p.dur(v, field)
		case "retention":
			o.Retention = p.dur(v, field)
		case "group":
			o.Group = p.str(v, field)
		default:
			return false
		}
		return true
	})
}

// payload is a string (its bytes) or a mapping or list (encoded as JSON,
// the form most asynq handlers unmarshal).
func (p *parser) payload(n *yaml.Node) []byte {
	switch {
	case isNull(n):
		return nil
	case n.Kind == yaml.ScalarNode:
		return []byte(n.Value)
	case n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode:
		var v any
		if err := n.Decode(&v); err != nil {
			p.fail(n, "task.payload", "%v", err)
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			p.fail(n, "task.payload", "cannot be encoded as JSON (mapping keys must be strings): %v", err)
			return nil
		}
		return b
	}
	p.fail(n, "task.payload", "must be a string or a mapping")
	return nil
}

// payloadJSON is JSON: a string holding JSON text (its bytes, kept as
// written), or a mapping or list (encoded as JSON).
func (p *parser) payloadJSON(n *yaml.Node) []byte {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		if !json.Valid([]byte(n.Value)) {
			p.fail(n, "task.payload_json", "not valid JSON (use payload for text, payload_base64 for bytes)")
			return nil
		}
		return []byte(n.Value)
	}
	if n.Kind == yaml.ScalarNode && !isNull(n) {
		p.fail(n, "task.payload_json", "must be a string of JSON text, or a mapping or list")
		return nil
	}
	return p.payload(n)
}

// payloadBase64 is bytes in standard base64, for payloads that are not text.
func (p *parser) payloadBase64(n *yaml.Node) []byte {
	s := p.str(n, "task.payload_base64")
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		p.fail(n, "task.payload_base64", "not standard base64: %v", err)
		return nil
	}
	return b
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func (p *parser) mapping(n *yaml.Node, field string) bool {
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, "must be a mapping")
		return false
	}
	return true
}

func (p *parser) str(n *yaml.Node, field string) string {
	if isNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		p.fail(n, field, "must be a single value, not a list or mapping")
		return ""
	}
	return n.Value
}

func (p *parser) dur(n *yaml.Node, field string) events.Duration {
	s := p.str(n, field)
	if s == "" {
		return 0
	}
	if n.Tag == "!!int" || n.Tag == "!!float" {
		p.fail(n, field, "%q has no unit: write a duration such as 30s, 10m or 1h", s)
		return 0
	}
	d, err := events.ParseDuration(s)
	if err != nil {
		p.fail(n, field, "%v", err)
		return 0
	}
	return d
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, true
		}
	}
	p.fail(n, field, "must be true or false, got %q", n.Value)
	return false, false
}
