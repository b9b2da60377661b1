package contract

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Selector is a parsed label selector, with Kubernetes' syntax and
// meaning, so the selectors teams already write for their pods work on
// entries. The zero Selector matches every entry.
type Selector struct {
	reqs []requirement
	text string
}

type selectorOp int

const (
	opEquals    selectorOp = iota // k=v, k==v: the label is set to v
	opNotEquals                   // k!=v: the label is not v, or not set
	opIn                          // k in (a,b): the label is set to one of them
	opNotIn                       // k notin (a,b): the label is none of them, or not set
	opExists                      // k
	opNotExists                   // !k
)

type requirement struct {
	key    string
	values []string // one for opEquals and opNotEquals; sorted for opIn and opNotIn
	op     selectorOp
}

// ErrBadSelector is wrapped by every ParseSelector error.
var ErrBadSelector = errors.New("bad label selector")

// ParseSelector parses a Kubernetes label selector: requirements joined by
// commas, all of which must hold.
//
//	k=v, k==v     the label is set to v
//	k!=v          the label is not v (true too when it is not set)
//	k in (a,b)    the label is set to a or b
//	k notin (a,b) the label is neither a nor b (true too when it is not set)
//	k             the label is set
//	!k            the label is not set
//
// Keys and values follow the label rules (ValidateLabelKey,
// ValidateLabelValue); a value may be empty ("k=", "k in (a,)"). Blanks
// between tokens are ignored. An empty selector matches everything. Errors
// wrap ErrBadSelector and read as Kubernetes' do ("found ')', expected:
// identifier").
func ParseSelector(s string) (Selector, error) {
	sel := Selector{text: strings.TrimSpace(s)}
	if sel.text == "" {
		return sel, nil
	}
	p := selectorParser{toks: lexSelector(sel.text)}
	reqs, err := p.parse()
	if err != nil {
		return Selector{}, fmt.Errorf("%w %q: %w", ErrBadSelector, sel.text, err)
	}
	sel.reqs = reqs
	return sel, nil
}

// Empty reports whether the selector matches everything.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// String returns the selector as it was given, trimmed.
func (s Selector) String() string { return s.text }

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

func (r requirement) matches(labels map[string]string) bool {
	v, has := labels[r.key]
	switch r.op {
	case opEquals:
		return has && v == r.values[0]
	case opNotEquals:
		return !has || v != r.values[0]
	case opIn:
		return has && slices.Contains(r.values, v)
	case opNotIn:
		return !has || !slices.Contains(r.values, v)
	case opExists:
		return has
	case opNotExists:
		return !has
	}
	return false
}

// selectorToken is one token of a selector: an identifier (a key or a
// value; "in" and "notin" are identifiers where a value is expected), an
// operator or a delimiter.
type selectorToken struct {
	kind tokenKind
	text string
}

type tokenKind int

const (
	tokEnd tokenKind = iota
	tokIdent
	tokComma
	tokOpen
	tokClose
	tokNot       // !
	tokEquals    // =
	tokDouble    // ==
	tokNotEquals // !=
	tokIn        // in
	tokNotIn     // notin
	tokBad       // a run of operator characters that is no operator
)

// lexSelector splits s into tokens, ending with tokEnd. Identifiers run
// until a blank or one of = ! ( ) , < >, as in Kubernetes, so a bad
// character inside one is reported by the key or value rules, not here.
func lexSelector(s string) []selectorToken {
	var toks []selectorToken
	for i := 0; ; {
		for i < len(s) && isSelectorBlank(s[i]) {
			i++
		}
		if i == len(s) {
			return append(toks, selectorToken{kind: tokEnd})
		}
		start := i
		if isSelectorSymbol(s[i]) {
			i++
			if (s[start] == '=' || s[start] == '!') && i < len(s) && s[i] == '=' {
				i++ // "==", "!="
			}
			toks = append(toks, symbolToken(s[start:i]))
			continue
		}
		for i < len(s) && !isSelectorSymbol(s[i]) && !isSelectorBlank(s[i]) {
			i++
		}
		word := s[start:i]
		switch word {
		case "in":
			toks = append(toks, selectorToken{tokIn, word})
		case "notin":
			toks = append(toks, selectorToken{tokNotIn, word})
		default:
			toks = append(toks, selectorToken{tokIdent, word})
		}
	}
}

func symbolToken(op string) selectorToken {
	kinds := map[string]tokenKind{",": tokComma, "(": tokOpen, ")": tokClose, "!": tokNot, "=": tokEquals, "==": tokDouble, "!=": tokNotEquals}
	if k, ok := kinds[op]; ok {
		return selectorToken{k, op}
	}
	return selectorToken{tokBad, op}
}

func isSelectorBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func isSelectorSymbol(c byte) bool {
	switch c {
	case '=', '!', '(', ')', ',', '<', '>':
		return true
	}
	return false
}

type selectorParser struct {
	toks []selectorToken
	pos  int
}

// peek and next read the current token; where a value is expected, "in"
// and "notin" are plain identifiers ("team in (in, out)").
func (p *selectorParser) peek(value bool) selectorToken {
	t := p.toks[p.pos]
	if value && (t.kind == tokIn || t.kind == tokNotIn) {
		t.kind = tokIdent
	}
	return t
}

func (p *selectorParser) next(value bool) selectorToken {
	t := p.peek(value)
	if t.kind != tokEnd {
		p.pos++
	}
	return t
}

func (p *selectorParser) parse() ([]requirement, error) {
	var reqs []requirement
	for {
		switch t := p.peek(true); t.kind {
		case tokIdent, tokNot:
			r, err := p.requirement()
			if err != nil {
				return nil, fmt.Errorf("unable to parse requirement: %w", err)
			}
			reqs = append(reqs, r)
			switch t := p.next(true); t.kind {
			case tokEnd:
				return reqs, nil
			case tokComma:
				if n := p.peek(true); n.kind != tokIdent && n.kind != tokNot {
					return nil, fmt.Errorf("found '%s', expected: identifier after ','", n.text)
				}
			default:
				return nil, fmt.Errorf("found '%s', expected: ',' or 'end of string'", t.text)
			}
		case tokEnd:
			return reqs, nil
		default:
			return nil, fmt.Errorf("found '%s', expected: !, identifier, or 'end of string'", t.text)
		}
	}
}

func (p *selectorParser) requirement() (requirement, error) {
	var r requirement
	negated := p.peek(true).kind == tokNot
	if negated {
		p.next(true)
	}
	key := p.next(true)
	if key.kind != tokIdent {
		return r, fmt.Errorf("found '%s', expected: identifier", key.text)
	}
	if err := ValidateLabelKey(key.text); err != nil {
		return r, err
	}
	r.key = key.text
	if n := p.peek(true); n.kind == tokEnd || n.kind == tokComma {
		r.op = opExists
		if negated {
			r.op = opNotExists
		}
		return r, nil
	}
	if negated {
		n := p.peek(true)
		return r, fmt.Errorf("found '%s', expected: ',' or 'end of string' after '!%s'", n.text, r.key)
	}
	switch op := p.next(false); op.kind {
	case tokEquals, tokDouble:
		r.op = opEquals
	case tokNotEquals:
		r.op = opNotEquals
	case tokIn:
		r.op = opIn
	case tokNotIn:
		r.op = opNotIn
	default:
		return r, fmt.Errorf("found '%s', expected: '=', '!=', '==', 'in', 'notin'", op.text)
	}
	var err error
	if r.op == opIn || r.op == opNotIn {
		r.values, err = p.valueSet()
	} else {
		r.values, err = p.exactValue()
	}
	if err != nil {
		return r, err
	}
	for _, v := range r.values {
		if err := ValidateLabelValue(r.key, v); err != nil {
			return r, err
		}
	}
	return r, nil
}

// exactValue reads the value of k=v, k==v or k!=v; none ("k=") is the
// empty value.
func (p *selectorParser) exactValue() ([]string, error) {
	switch t := p.peek(true); t.kind {
	case tokEnd, tokComma:
		return []string{""}, nil
	case tokIdent:
		p.next(true)
		return []string{t.text}, nil
	default:
		return nil, fmt.Errorf("found '%s', expected: identifier", t.text)
	}
}

// valueSet reads "(a, b, ...)"; an empty place ("()", "(a,)") is the empty
// value.
func (p *selectorParser) valueSet() ([]string, error) {
	if t := p.next(true); t.kind != tokOpen {
		return nil, fmt.Errorf("found '%s', expected: '('", t.text)
	}
	var values []string
	expectValue := true
	for {
		switch t := p.next(true); t.kind {
		case tokIdent:
			if !expectValue {
				return nil, fmt.Errorf("found '%s', expected: ',' or ')'", t.text)
			}
			values, expectValue = append(values, t.text), false
		case tokComma:
			if expectValue {
				values = append(values, "")
			}
			expectValue = true
		case tokClose:
			if expectValue {
				values = append(values, "")
			}
			slices.Sort(values)
			return slices.Compact(values), nil
		case tokEnd:
			return nil, fmt.Errorf("found 'end of string', expected: ',', ')' or identifier")
		default:
			return nil, fmt.Errorf("found '%s', expected: ',', ')' or identifier", t.text)
		}
	}
}
