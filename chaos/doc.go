// Package chaos is cronstream's chaos suite (issue 8): real `cronstream run`
// replica processes, real asynq worker processes, a real redis-server with
// AOF and an embedded 3-node NATS cluster, while replicas are killed with
// SIGKILL, NATS nodes stopped, workers killed mid-task and Redis restarted,
// at random from a printed seed. It also holds the network-cut test: one
// replica cut off from NATS through a TCP proxy the test controls.
//
// It owns only tests and their fixture worker (testdata/worker); it never
// changes production code and nothing imports it. Run it with `make chaos`
// (short form) or `make chaos DURATION=10m` (long form).
package chaos
