package console

import (
	"slices"
	"testing"
	"time"
)

// TestNiceScale: the y axis steps by 1, 2 or 5 times a power of ten, in at
// most five steps, up to the first step at or above the peak.
func TestNiceScale(t *testing.T) {
	for _, c := range []struct{ peak, step, top int64 }{
		{0, 1, 1}, {1, 1, 1}, {5, 1, 5}, {7, 2, 8}, {42, 10, 50}, {100, 20, 100}, {110, 50, 150}, {12_345, 5_000, 15_000},
	} {
		if step, top := niceScale(c.peak, 5); step != c.step || top != c.top {
			t.Errorf("niceScale(%d) = %d, %d; want %d, %d", c.peak, step, top, c.step, c.top)
		}
	}
}

// TestTimeTicks: ticks fall on whole steps of the clock, at most eight,
// placed by their time, dated when the window spans days.
func TestTimeTicks(t *testing.T) {
	from := time.Date(2027, 3, 1, 23, 6, 0, 0, time.UTC)
	labels := func(ts []axisTick) (out []string) {
		for _, tk := range ts {
			out = append(out, tk.Label)
		}
		return out
	}
	day := timeTicks(from, 24*time.Hour, 960)
	if want := []string{"00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00", "21:00"}; !slices.Equal(labels(day), want) {
		t.Errorf("24h ticks %q, want %q", labels(day), want)
	}
	if x := day[0].X; x != 36 { // 54 of 1,440 minutes
		t.Errorf("00:00 at x %.2f, want 36", x)
	}
	week := timeTicks(from, 168*time.Hour, 960)
	if len(week) != 7 || week[0].Label != "Mar 2" || week[6].Label != "Mar 8" {
		t.Errorf("168h ticks %q", labels(week))
	}
	if hour := labels(timeTicks(from, time.Hour, 960)); !slices.Equal(hour, []string{"23:10", "23:20", "23:30", "23:40", "23:50", "00:00"}) {
		t.Errorf("1h ticks %q", hour)
	}
}

// TestWords: free text becomes escaped words in spans that do not wrap;
// markup and control characters in it stay text.
func TestWords(t *testing.T) {
	for in, want := range map[string]string{
		"":                                  "",
		"redis: connection  lost":           `<span class="w">redis:</span> <span class="w">connection</span> <span class="w">lost</span>`,
		`<script>alert("x")</script> & 'q'`: `<span class="w">&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;</span> <span class="w">&amp;</span> <span class="w">&#39;q&#39;</span>`,
		"bell\x07 \x1b[31mred":              `<span class="w">bell\x07</span> <span class="w">\x1b[31mred</span>`,
	} {
		if got := string(words(in)); got != want {
			t.Errorf("words(%q) = %s, want %s", in, got, want)
		}
	}
}
