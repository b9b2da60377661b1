package configsync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultMaxFileBytes bounds the schedules files Load, LoadFile and Read
// accept unless told otherwise: 4 MiB holds some 15,000 entries as
// `cronstream export` writes them, and keeps what checking a hostile file
// of that size allocates near 1 GiB (see Parse; ordinary entries take
// about 150 MiB).
const DefaultMaxFileBytes = 4 << 20

// ErrFileTooLarge is wrapped by the error for a schedules file over its
// size limit.
var ErrFileTooLarge = errors.New("schedules file too large")

// Load reads and validates a schedules file (YAML, or JSON with the same
// fields) of at most DefaultMaxFileBytes.
func Load(path string) ([]Config, error) { return LoadFile(path, 0) }

// LoadFile is Load with a size limit of maxBytes (below 1:
// DefaultMaxFileBytes). A regular file over it is refused from its size,
// before any of it is read; anything else (a pipe, a device) is read up to
// one byte past the limit, and refused there.
func LoadFile(path string, maxBytes int64) ([]Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read schedules file: %w", err)
	}
	defer f.Close()
	return Read(f, path, maxBytes)
}

// Read reads and validates a schedules file from r (standard input, say);
// source names it in errors. Content of more than maxBytes (below 1:
// DefaultMaxFileBytes) is refused once one byte past the limit was read,
// or at once when r is a regular file that large.
func Read(r io.Reader, source string, maxBytes int64) ([]Config, error) {
	limit := maxBytes
	if limit < 1 {
		limit = DefaultMaxFileBytes
	}
	var buf bytes.Buffer
	if f, ok := r.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			if st.Size() > limit {
				return nil, fmt.Errorf("%w: %s is %d bytes, more than the limit of %d", ErrFileTooLarge, source, st.Size(), limit)
			}
			// One allocation for the whole file; ReadFrom wants MinRead
			// spare to see the end without growing.
			buf.Grow(int(st.Size()) + bytes.MinRead)
		}
	}
	n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read schedules file %s: %w", source, err)
	}
	if n > limit {
		return nil, fmt.Errorf("%w: %s holds more than the limit of %d bytes", ErrFileTooLarge, source, limit)
	}
	return Parse(buf.Bytes(), source)
}
