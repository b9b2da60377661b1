// Package systembench holds the full-system benchmarks: real `cronstream run`
// processes (built from ./cmd/cronstream), a real redis-server and an
// embedded nats-server, measured from outside as a deployment runs, each
// beside its baseline in the same run. The scale benchmarks (BenchmarkScaleOut,
// BenchmarkOverload, BenchmarkSustained/replicas=3vs1) run nats-server as a
// process of its own (built from the module's dependency) so that its CPU is
// measured apart, and put each replica in a cgroup CPU quota of its own where
// one can be made (root). The benchmarks live in the _test files; `go test`
// without -bench runs none of them and starts nothing.
//
//	go test -run '^$' -bench . -benchtime 1x -timeout 60m -v ./internal/systembench/
//
// Sizes come from the environment (each benchmark's comment names its
// variables); the defaults are small so that a run proves the wiring in a
// few minutes. docs/benchmarks.md ("Full system") has the figures and the
// commands at the sizes of the goals.
package systembench
