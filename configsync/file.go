package configsync

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// InvalidError lists the problems found in a set of configs; nothing of it
// may be applied.
type InvalidError struct {
	Source   string
	Problems []Problem
	// More is set when there were more problems than MaxProblems: the
	// check stopped at the last one listed.
	More bool
}

// MaxProblems bounds the problems one check lists. A file with more stops
// there: a hostile file cannot make the list grow with its size, and the
// first hundred are what to fix first.
const MaxProblems = 100

func (e *InvalidError) Error() string {
	var b strings.Builder
	n := len(e.Problems)
	fmt.Fprintf(&b, "%s is invalid (%d problem", e.Source, n)
	if n != 1 {
		b.WriteString("s")
	}
	if e.More {
		b.WriteString(", and more not listed: the check stopped there")
	}
	b.WriteString("):")
	for _, p := range e.Problems {
		b.WriteString("\n  - " + p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *InvalidError) Unwrap() error { return ErrInvalidConfig }

// Parse reads and validates a schedules file's content; source names it in
// errors. Every problem is reported (up to MaxProblems), each with its
// entry, field and line: unknown fields (typo protection), values of the
// wrong kind, entries that fail validation, and ids given twice.
//
// Memory: the YAML parser (gopkg.in/yaml.v3) holds the whole document as a
// node tree, about 190 bytes per node, before Parse reads any of it; keys
// without values ("{a,a,a,...}", two nodes per two bytes) are the costliest
// shape tried. Parse then walks one entry at a time, checks it at once,
// lets its nodes go and keeps a config only while the file is valid, so
// what it adds stays small beside the tree. Everything it allocates stays
// below 256 bytes per byte of data plus 8 MiB, whatever data holds
// (TestParseMemoryBound); ordinary entries take about 38.
func Parse(data []byte, source string) ([]Config, error) {
	p := &parser{source: source, index: -1}
	cfgs := p.parse(data)
	if len(p.list) > 0 {
		slices.SortStableFunc(p.list, func(a, b Problem) int { return a.Line - b.Line })
		return nil, &InvalidError{Source: source, Problems: p.list, More: p.more}
	}
	return cfgs, nil
}

// The bound TestParseMemoryBound holds Parse to: what it allocates in all
// (so its peak memory too) per byte of its input, plus the parser's fixed
// costs (its buffers, and the stacks of a document nested as deep as
// gopkg.in/yaml.v3 allows, 10,000 levels).
const (
	maxAllocPerFileByte = 256
	parseAllocBase      = 8 << 20
)

// Validate checks configs as a sync would before publishing anything:
// every entry must pass validation and ids must be unique.
func Validate(cfgs []Config) error {
	var ps problems
	seen := map[string]int{}
	for i, c := range cfgs {
		if ps.full() {
			break
		}
		ps.addAll(checkConfig(c, i, 0, seen))
	}
	if len(ps.list) > 0 {
		return &InvalidError{Source: "configs", Problems: ps.list, More: ps.more}
	}
	return nil
}

// problems is a list bounded by MaxProblems.
type problems struct {
	list []Problem
	more bool
}

func (ps *problems) full() bool { return len(ps.list) >= MaxProblems }

func (ps *problems) add(p Problem) {
	if ps.full() {
		ps.more = true
		return
	}
	ps.list = append(ps.list, p)
}

func (ps *problems) addAll(list []Problem) {
	for _, p := range list {
		ps.add(p)
	}
}

// checkConfig returns the problems of config c, the i-th, whose mapping is
// at line: its validation, and its id given before (seen holds the ids of
// the configs before it, and gets c's).
func checkConfig(c Config, i, line int, seen map[string]int) []Problem {
	var out []Problem
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
	source string
	problems
	entry string
	index int // of the entry being parsed, -1 outside entries
	// fieldLine is the line of each field's value in the entry being
	// parsed, so validation problems point at their line too.
	fieldLine map[string]int
}

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	if p.full() {
		p.more = true // and nothing formatted: a hostile file may fail on every node
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.add(Problem{Entry: p.entry, Field: field, Line: line, Message: fmt.Sprintf(format, args...), index: p.index})
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
		if len(p.list) == 0 {
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
	var out []Config
	seen := map[string]int{}
	for i, n := range list.Content {
		// The entry's nodes go once it is read: the configs that grow
		// take the place of the tree that shrinks.
		list.Content[i] = nil
		if p.full() {
			p.more = true
			break
		}
		c, ok := p.entryOf(n, i, seen)
		if !ok || len(p.list) > 0 {
			out = nil // an invalid file returns nothing: keep nothing
			continue
		}
		out = append(out, c)
	}
	p.entry, p.index = "", -1
	return out
}

// entryOf reads and checks the i-th entry (n); ok is false when it is not
// even a mapping.
func (p *parser) entryOf(n *yaml.Node, i int, seen map[string]int) (Config, bool) {
	p.entry, p.index = fmt.Sprintf("entries[%d]", i), i
	clear(p.fieldLine)
	if n.Kind != yaml.MappingNode {
		p.fail(n, "", "an entry must be a mapping with at least id, cron and task.type")
		return Config{}, false
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == "id" && n.Content[j+1].Kind == yaml.ScalarNode && events.ValidateID(n.Content[j+1].Value) == nil {
			p.entry = n.Content[j+1].Value
		}
	}
	parsed := len(p.list)
	c := p.entryNode(n)
	// Validation runs on what parsed, so one pass lists every problem; a
	// field that already failed to parse is not reported again.
	failed := map[string]bool{}
	for _, pr := range p.list[parsed:] {
		failed[pr.Field] = true
	}
	for _, pr := range checkConfig(c, i, n.Line, seen) {
		if failed[pr.Field] {
			continue
		}
		if l, ok := p.lineOf(pr.Field); ok {
			pr.Line = l
		}
		p.add(pr)
	}
	return c, true
}

// lineOf is the line of field in the entry being parsed, or of the nearest
// field above it ("labels" for "labels.team").
func (p *parser) lineOf(field string) (int, bool) {
	for field != "" {
		if l, ok := p.fieldLine[field]; ok {
			return l, true
		}
		i := strings.LastIndexByte(field, '.')
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0, false
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
		if !f(k.Value, v) {
			p.fail(k, name, "unknown field%s", hint(k.Value))
			continue
		}
		// Lines of the fields validation can name: a map's members only
		// up to the most a map may have, so the record stays small.
		if p.index >= 0 && len(seen) <= maxMembersWithLines {
			if p.fieldLine == nil {
				p.fieldLine = map[string]int{}
			}
			p.fieldLine[name] = v.Line
		}
	}
}

// maxMembersWithLines is the largest map (labels, headers) whose members'
// lines are kept; beyond, problems point at the map's line.
const maxMembersWithLines = 65

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
