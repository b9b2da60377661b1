package contract

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
	maxLabels       = 64
	maxLabelName    = 63
	maxLabelPrefix  = 253
	labelField      = "labels"
	labelNameRule   = "must be 1-63 characters of A-Z a-z 0-9 - _ . beginning and ending with a letter or digit"
	labelValueRule  = "must be at most 63 characters of A-Z a-z 0-9 - _ . beginning and ending with a letter or digit"
	labelPrefixRule = "prefix must be a DNS subdomain: at most 253 characters of a-z 0-9 - . beginning and ending with a letter or digit"
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
