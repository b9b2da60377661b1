#!/usr/bin/env bash
# Runs every package's tests with the race detector, as `make test` does
# after vetting (what CI runs), once every package is compiled. Most tests
# wait for ticks, leases, servers and processes rather than for the CPU,
# so the packages run in four groups at once, each group's output printed
# whole after the last ends:
#
#   chaos       the chaos suite, built at nice 10, run at normal priority:
#               it kills and restarts whole deployments and holds them to
#               the catch-up grace, which a machine busy with -race tests
#               at the same priority can starve.
#   throughput  the scheduler's tests that measure firing against a fixed
#               capacity (they call no t.Parallel), in a process of their
#               own instead of holding the scheduler package's other tests
#               back until they end; at nice 10.
#   waiting     the packages whose tests mostly wait and take little CPU,
#               at nice 10.
#   rest        every other package at nice 10, two at a time, the longest
#               first.
#
# GO names the go command (default go).
set -uo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}

slow=(./cmd/cronstream ./internal/scheduler)
waiting=(./internal/ownership ./internal/recoverer ./internal/taskstate ./internal/replica
	./internal/failpause ./internal/keygc ./audit ./asynqcompat ./internal/testenv ./internal/asynqimport)
throughput='^(TestOverloadDegrades|TestFairAcrossQueues)$'
flags=(-race -count=1 -timeout 20m -parallel 8)

dir=$(mktemp -d)
declare -A jobs
# Interrupted, the whole process group goes: the groups' go commands, test
# binaries and the servers and replicas they started.
trap 'trap - INT TERM; rm -rf "$dir"; kill 0' INT TERM

# Every package is compiled for its test first, none run (-exec true):
# compiling beside the tests, as a cold build cache (CI's) otherwise does
# for the first minutes, takes the CPU that their ticks and leases wait
# for.
echo "compiling the test binaries"
if ! "$go" test -race -count=1 -exec true ./... >"$dir/compile" 2>&1; then
	cat "$dir/compile"
	rm -rf "$dir"
	exit 1
fi

# binary NICE PKG RUN...: builds PKG's test binary at nice 10, then runs
# it from PKG's directory at nice NICE with the test flags RUN.
binary() {
	local prio=$1 pkg=$2 name
	name=$(basename "$pkg")
	shift 2
	nice -n 10 "$go" test -race -c -o "$dir/$name.test" "$pkg" &&
		(cd "$pkg" && nice -n "$prio" "$dir/$name.test" -test.count=1 -test.timeout 20m "$@") &&
		echo "ok   $pkg"
}

binary 0 ./chaos >"$dir/chaos" 2>&1 &
jobs[chaos]=$!
binary 10 ./internal/scheduler -test.run "$throughput" >"$dir/throughput" 2>&1 &
jobs[throughput]=$!
nice -n 10 "$go" test "${flags[@]}" "${waiting[@]}" >"$dir/waiting" 2>&1 &
jobs[waiting]=$!

"$go" list ./chaos "${waiting[@]}" "${slow[@]}" >"$dir/apart"
echo "chaos, scheduler's throughput tests, ${waiting[*]} in the background"
nice -n 10 "$go" test "${flags[@]}" -skip "$throughput" "${slow[@]}" $("$go" list ./... | grep -vxF -f "$dir/apart")
rc=$?

for name in throughput waiting chaos; do
	wait "${jobs[$name]}" || rc=1
	echo "--- $name:"
	cat "$dir/$name"
done
rm -rf "$dir"
exit $rc
