// Package replica wires one cronstream replica: the projector, scheduler,
// recoverer and relay, the heartbeat in the replicas bucket, and the HTTP
// endpoints for health, readiness and metrics.
//
// It owns start-up order, shutdown order and readiness; it holds no
// scheduling or recovery logic of its own.
package replica
