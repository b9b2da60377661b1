package testenv

import (
	"flag"
	"runtime"
	"strconv"
)

// DefaultParallel sets how many of a package's parallel tests run at once
// when -parallel is not given: at least n, or GOMAXPROCS when more. For a
// package whose tests spend their time waiting (for ticks, for servers,
// for the processes they start), little of it on the CPU: go test's
// default (GOMAXPROCS) would leave a small machine mostly idle while they
// wait one or two at a time. Call it from TestMain before m.Run; it
// parses the command line.
func DefaultParallel(n int) error {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if set {
		return nil
	}
	return flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
}
