// Package deploycheck holds the tests that keep the deployment files
// (docker-compose.yml, Dockerfile, examples/schedules.yaml, the Kubernetes
// manifests, the Grafana dashboard and the Prometheus rules in deploy/)
// consistent with the code: no Docker engine or cluster is needed to run
// them; the binary is built once and run against real NATS and Redis.
package deploycheck
