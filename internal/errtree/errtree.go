// Package errtree reads the tree of wrapped and joined errors for tests:
// errors.As finds only the first error of a type, a validation error joins
// several. It is for tests only; non-test code must not import it.
package errtree

// Collect returns f of every error of type E in err's tree, depth first in
// wrapping order. It does not look inside an error of type E.
func Collect[E error, V any](err error, f func(E) V) []V {
	var out []V
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if m, ok := e.(E); ok {
			out = append(out, f(m))
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
