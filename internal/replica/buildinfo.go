package replica

import (
	"cmp"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfoGauge is cronstream_build_info: 1, labelled with what the
// replica was built from, so dashboards can tell versions apart during a
// rolling upgrade.
func buildInfoGauge(version, revision string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cronstream_build_info",
		Help: "Always 1; the labels say the version, VCS revision and Go version this replica was built from.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(cmp.Or(version, "unknown"), cmp.Or(revision, "unknown"), runtime.Version()).Set(1)
	return g
}
