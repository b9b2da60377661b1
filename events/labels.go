package events

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Labels follow Kubernetes' rules, so selectors and habits carry over: a
// key is an optional DNS-subdomain prefix and '/' and a name; names and
// values are at most 63 characters of [A-Za-z0-9_.-], beginning and ending
// with a letter or digit (a value may be empty).
const (
	maxLabels         = 64
	maxLabelName      = 63
	maxLabelPrefix    = 253
	labelField        = "labels"
	labelNameRule     = "must be 1-63 characters of A-Z a-z 0-9 - _ . beginning and ending with a letter or digit"
	labelValueRule    = "must be at most 63 characters of A-Z a-z 0-9 - _ . beginning and ending with a letter or digit"
	labelPrefixRule   = "prefix must be a DNS subdomain: at most 253 characters of a-z 0-9 - . beginning and ending with a letter or digit"
	selectorSyntaxDoc = "a selector is requirements joined by commas: k=v, k==v, k!=v, k (has the label) or !k (has not)"
)

// ValidateLabelKey checks one label key.
func ValidateLabelKey(k string) error {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if !validPrefix(prefix) {
			return &FieldError{Field: labelField, Value: shorten(k), Reason: "key " + labelPrefixRule}
		}
		name = rest
	}
	if name == "" || !validLabelValue(name) {
		return &FieldError{Field: labelField, Value: shorten(k), Reason: "key name " + labelNameRule}
	}
	return nil
}

// ValidateLabelValue checks one label value.
func ValidateLabelValue(k, v string) error {
	if !validLabelValue(v) {
		return &FieldError{Field: labelField + "." + shorten(k), Value: shorten(v), Reason: "value " + labelValueRule}
	}
	return nil
}

// ValidateLabels checks an entry's labels; the error joins one *FieldError
// per bad key or value.
func ValidateLabels(labels map[string]string) error {
	if len(labels) == 0 {
		return nil
	}
	var errs []error
	if len(labels) > maxLabels {
		errs = append(errs, &FieldError{Field: labelField, Value: fmt.Sprintf("%d labels", len(labels)), Reason: fmt.Sprintf("at most %d labels", maxLabels)})
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := ValidateLabelKey(k); err != nil {
			errs = append(errs, err)
		} else if err := ValidateLabelValue(k, labels[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ParseLabel reads "k=v" (as --label takes it) and validates both.
func ParseLabel(s string) (k, v string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", &FieldError{Field: labelField, Value: shorten(s), Reason: "must be key=value"}
	}
	if err := ValidateLabelKey(k); err != nil {
		return "", "", err
	}
	if err := ValidateLabelValue(k, v); err != nil {
		return "", "", err
	}
	return k, v, nil
}

func validLabelValue(v string) bool {
	if len(v) > maxLabelName {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && ((i == 0 || i == len(v)-1) || c != '-' && c != '_' && c != '.') {
			return false
		}
	}
	return true
}

func validPrefix(p string) bool {
	if p == "" || len(p) > maxLabelPrefix {
		return false
	}
	for _, part := range strings.Split(p, ".") {
		if part == "" || len(part) > 63 {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
			if !alnum && (i == 0 || i == len(part)-1 || c != '-') {
				return false
			}
		}
	}
	return true
}

// Selector is a parsed label selector. The zero Selector matches every
// entry.
type Selector struct {
	reqs []requirement
	text string
}

type selectorOp int

const (
	opEquals selectorOp = iota
	opNotEquals
	opExists
	opNotExists
)

type requirement struct {
	key, value string
	op         selectorOp
}

// ErrBadSelector is wrapped by every ParseSelector error.
var ErrBadSelector = errors.New("bad label selector")

// ParseSelector parses a Kubernetes equality-based selector: requirements
// joined by commas, all of which must hold — "k=v" (or "k==v"), "k!=v"
// (true too when the label is absent), "k" (the label is set) and "!k"
// (it is not). An empty selector matches everything.
func ParseSelector(s string) (Selector, error) {
	sel := Selector{text: strings.TrimSpace(s)}
	if sel.text == "" {
		return sel, nil
	}
	for _, part := range strings.Split(sel.text, ",") {
		part = strings.TrimSpace(part)
		var r requirement
		switch {
		case part == "":
			return Selector{}, fmt.Errorf("%w %q: empty requirement (%s)", ErrBadSelector, s, selectorSyntaxDoc)
		case strings.Contains(part, "!="):
			r.key, r.value, _ = strings.Cut(part, "!=")
			r.op = opNotEquals
		case strings.Contains(part, "=="):
			r.key, r.value, _ = strings.Cut(part, "==")
		case strings.Contains(part, "="):
			r.key, r.value, _ = strings.Cut(part, "=")
		case strings.HasPrefix(part, "!"):
			r.key, r.op = strings.TrimSpace(part[1:]), opNotExists
		default:
			r.key, r.op = part, opExists
		}
		r.key, r.value = strings.TrimSpace(r.key), strings.TrimSpace(r.value)
		if err := ValidateLabelKey(r.key); err != nil {
			return Selector{}, fmt.Errorf("%w %q: %w (%s)", ErrBadSelector, s, err, selectorSyntaxDoc)
		}
		if r.op == opEquals || r.op == opNotEquals {
			if err := ValidateLabelValue(r.key, r.value); err != nil {
				return Selector{}, fmt.Errorf("%w %q: %w", ErrBadSelector, s, err)
			}
		}
		sel.reqs = append(sel.reqs, r)
	}
	return sel, nil
}

// Empty reports whether the selector matches everything.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// String returns the selector as it was given, trimmed.
func (s Selector) String() string { return s.text }

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		v, has := labels[r.key]
		switch r.op {
		case opEquals:
			if !has || v != r.value {
				return false
			}
		case opNotEquals:
			if has && v == r.value {
				return false
			}
		case opExists:
			if !has {
				return false
			}
		case opNotExists:
			if has {
				return false
			}
		}
	}
	return true
}
