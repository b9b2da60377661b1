package configsync

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hostileFile builds a schedules file of about size bytes in one shape:
// valid ones as people and export write them, and malformed ones chosen to
// cost the parser the most per byte.
func hostileFile(shape string, size int) []byte {
	var b bytes.Buffer
	repeat := func(head, unit, tail string) []byte {
		b.WriteString(head)
		for b.Len() < size {
			b.WriteString(unit)
		}
		b.WriteString(tail)
		return b.Bytes()
	}
	entries := func(entry func(i int) string, tail string) []byte {
		b.WriteString("entries:\n")
		for i := 0; b.Len() < size; i++ {
			b.WriteString(entry(i))
		}
		b.WriteString(tail)
		return b.Bytes()
	}
	switch shape {
	case "valid":
		return entries(func(i int) string {
			return fmt.Sprintf("  - id: report-%d\n    cron: 0 9 * * *\n    timezone: Europe/Berlin\n    task:\n      type: report:daily\n      payload_json: '{\"team\":\"ops\"}'\n    options:\n      queue: reports\n      max_retry: 5\n      timeout: 10m\n    paused: false\n    owner: sync\n", i)
		}, "")
	case "valid-flow":
		b.WriteString("entries: [")
		for i := 0; b.Len() < size; i++ {
			fmt.Fprintf(&b, "{id: e%d, cron: '@daily', task: {type: t}},", i)
		}
		b.WriteString("{id: z, cron: '@daily', task: {type: t}}]")
		return b.Bytes()
	case "invalid-entries":
		return entries(func(i int) string { return fmt.Sprintf("  - id: e%d\n    cron: nope\n    task: {type: ''}\n", i) }, "")
	case "duplicate-ids":
		return entries(func(int) string { return "  - {id: a, cron: '@daily', task: {type: t}}\n" }, "")
	case "syntax-error-at-end":
		return entries(func(i int) string { return fmt.Sprintf("  - id: e%d\n    cron: '@daily'\n    task: {type: t}\n", i) }, "  - [unclosed\n")
	case "flow-ints":
		return repeat("entries: [", "1,", "1]")
	case "flow-keys":
		// Two nodes (a key and its null value) per two bytes: the most
		// the YAML parser spends per byte of the shapes tried.
		return repeat("entries: [{", "a,", "a}]")
	case "flow-maps":
		return repeat("entries: [", "{},", "{}]")
	case "block-nulls":
		return repeat("entries:\n", "-\n", "")
	case "unknown-keys":
		b.WriteString("entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n")
		for i := 0; b.Len() < size; i++ {
			fmt.Fprintf(&b, "    k%d: 1\n", i)
		}
		return b.Bytes()
	case "labels":
		b.WriteString("entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    labels:\n")
		for i := 0; b.Len() < size; i++ {
			fmt.Fprintf(&b, "      k%d: v\n", i)
		}
		return b.Bytes()
	case "payload-list":
		// A payload given as YAML is decoded and encoded as JSON: more
		// than the tree alone; past the 1 MiB a payload may have.
		size = max(size, 1<<20+1<<10)
		return repeat("entries:\n  - id: a\n    cron: '@daily'\n    task:\n      type: t\n      payload: [", "1,", "1]\n")
	case "alias-bomb":
		b.WriteString("entries:\n  - id: a\n    cron: '@daily'\n    task:\n      type: t\n      payload:\n        l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
		for i := 1; i < 9; i++ {
			fmt.Fprintf(&b, "        l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
		}
		return b.Bytes()
	case "long-note":
		return repeat("entries:\n  - id: a\n    cron: '@daily'\n    task: {type: t}\n    note: ", "n", "\n")
	case "deep":
		depth := min(size/2, 9000)
		return []byte("entries: " + strings.Repeat("[", depth) + strings.Repeat("]", depth))
	}
	panic("unknown shape " + shape)
}

var (
	validShapes     = []string{"valid", "valid-flow"}
	malformedShapes = []string{"invalid-entries", "duplicate-ids", "syntax-error-at-end", "flow-ints", "flow-keys", "flow-maps", "block-nulls",
		"unknown-keys", "labels", "payload-list", "alias-bomb", "long-note", "deep"}
)

// memoryOf runs f and returns what it allocated in all (TotalAlloc, which
// no peak can exceed) and the peak of the live heap above where it began,
// sampled every 100 µs (a lower bound of the true peak).
func memoryOf(f func()) (total, peak uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, alloc0 := ms.HeapAlloc, ms.TotalAlloc
	var high atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > high.Load() {
				high.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(stop)
	<-done
	runtime.ReadMemStats(&ms)
	total = ms.TotalAlloc - alloc0
	if h := high.Load(); h > base {
		peak = h - base
	}
	return total, peak
}

// TestParseMemoryBound: reading and checking a schedules file, valid or
// malformed in the ways that cost the most, from a file or from a stream,
// allocates at most maxAllocPerFileByte times the file's size in all (so
// its peak memory stays below that); a malformed file is refused.
func TestParseMemoryBound(t *testing.T) {
	const size = 512 << 10
	dir := t.TempDir()
	for _, shape := range append(validShapes, malformedShapes...) {
		data := hostileFile(shape, size)
		path := filepath.Join(dir, shape+".yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		vias := []string{"file"}
		if shape == "valid" || shape == "flow-keys" {
			vias = append(vias, "stream") // the costliest shape, and the common one, through Read too
		}
		for _, via := range vias {
			var err error
			total, peak := memoryOf(func() {
				if via == "file" {
					_, err = LoadFile(path, 0)
				} else {
					_, err = Read(bytes.NewReader(data), "stdin", 0)
				}
			})
			valid := shape == "valid" || shape == "valid-flow"
			if (err == nil) != valid {
				t.Errorf("%s via %s: error %.200v, want valid %t", shape, via, err, valid)
			}
			t.Logf("%-20s %-6s %7.3f MB: allocated %5.1f× its size, peak at least %5.1f×", shape, via, float64(len(data))/1e6,
				float64(total)/float64(len(data)), float64(peak)/float64(len(data)))
			if bound := maxAllocPerFileByte*uint64(len(data)) + parseAllocBase; total > bound {
				t.Errorf("%s via %s: allocated %d bytes for %d, over the bound of %d", shape, via, total, len(data), bound)
			}
		}
	}
}

// TestFileSizeLimit: a file over the limit is refused before it is read
// (its size alone), and a stream once it passed the limit.
func TestFileSizeLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	data := hostileFile("valid", 64<<10)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	limit := int64(len(data) - 1)
	total, _ := memoryOf(func() {
		if _, err := LoadFile(path, limit); !isTooLarge(err) {
			t.Errorf("LoadFile over the limit: %v", err)
		}
	})
	if total > 16<<10 {
		t.Errorf("refusing a %d-byte file allocated %d bytes: it was read", len(data), total)
	}
	if _, err := Read(bytes.NewReader(data), "stdin", limit); !isTooLarge(err) {
		t.Errorf("Read over the limit: %v", err)
	}
	for _, max := range []int64{int64(len(data)), 0} {
		if cfgs, err := LoadFile(path, max); err != nil || len(cfgs) == 0 {
			t.Errorf("LoadFile at limit %d: %d configs, %v", max, len(cfgs), err)
		}
		if cfgs, err := Read(bytes.NewReader(data), "stdin", max); err != nil || len(cfgs) == 0 {
			t.Errorf("Read at limit %d: %d configs, %v", max, len(cfgs), err)
		}
	}
	if _, err := (FileProvider{Path: path, MaxBytes: limit}).GetConfigs(); !isTooLarge(err) {
		t.Errorf("FileProvider over its limit: %v", err)
	}
}

func isTooLarge(err error) bool {
	return err != nil && strings.Contains(err.Error(), "limit") && errors.Is(err, ErrFileTooLarge)
}

// BenchmarkParseMemory reports, per byte of a schedules file, what reading
// and checking it allocates in all and the peak of the live heap (sampled),
// for valid files and malformed ones. Size: CRONSTREAM_BENCH_FILE_MB
// (default 4).
func BenchmarkParseMemory(b *testing.B) {
	size := 4 << 20
	if v := os.Getenv("CRONSTREAM_BENCH_FILE_MB"); v != "" {
		var mb int
		if _, err := fmt.Sscan(v, &mb); err != nil || mb < 1 {
			b.Fatalf("CRONSTREAM_BENCH_FILE_MB=%q", v)
		}
		size = mb << 20
	}
	for _, shape := range append(validShapes, malformedShapes...) {
		data := hostileFile(shape, size)
		b.Run(shape, func(b *testing.B) {
			var total, peak uint64
			for b.Loop() {
				t, p := memoryOf(func() { _, _ = Read(bytes.NewReader(data), "bench", int64(len(data))) })
				total, peak = max(total, t), max(peak, p)
			}
			b.ReportMetric(float64(total)/float64(len(data)), "alloc-B/file-B")
			b.ReportMetric(float64(peak)/float64(len(data)), "peak-B/file-B")
			b.ReportMetric(float64(len(data)), "file-B")
		})
	}
}
