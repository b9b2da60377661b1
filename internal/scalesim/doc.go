// Package scalesim simulates cronstream at internet scale, in one process
// and in simulated time (docs/design.md "Ownership", "What the simulation
// proves"): many replicas, each the real scheduler and the real shard
// ownership, on one manual clock (clock.Manual), sharing one projection
// (projector.FromFold) and one Redis modelled in memory, whose fire step
// is the fire script's compare-and-set of the watermark and whose shard
// leases are the lease scripts'. Replicas join, leave and are killed
// while a million entries fire; the tests check that each replica's
// attempts, watermark reads and heap operations stay within their share,
// that the shards are spread evenly, that no tick fires twice or is
// missed, and that a killed replica's shards are taken over within the
// catch-up grace.
//
// It holds only tests. `go test ./internal/scalesim/` runs the simulation
// at a scale make test affords; CRONSTREAM_SIM_ENTRIES=1000000 runs it at
// full scale (docs/benchmarks.md).
package scalesim
