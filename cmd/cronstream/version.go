package main

import (
	"runtime"
	"runtime/debug"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version string

// buildInfo is what this binary was built from: the -ldflags version, else
// the module version Go recorded (a tag or pseudo-version for
// `go install …@version`, "(devel)" in a checkout); the VCS revision when
// built from a checkout; and the Go version.
type buildInfo struct {
	Version   string
	Revision  string
	GoVersion string
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return withUnknown(b)
	}
	if b.Version == "" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			b.Revision = s.Value
		}
	}
	return withUnknown(b)
}

func withUnknown(b buildInfo) buildInfo {
	if b.Version == "" {
		b.Version = "unknown"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
}

// versionString is what --version prints after the name.
func versionString() string {
	b := readBuildInfo()
	return b.Version + " (revision " + b.Revision + ", " + b.GoVersion + ")"
}
