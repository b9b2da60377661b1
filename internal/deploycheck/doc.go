// Package deploycheck holds the tests that keep the deployment files
// (docker-compose.yml, Dockerfile, examples/schedules.yaml) consistent with
// the code: no Docker engine is needed to run them.
package deploycheck
