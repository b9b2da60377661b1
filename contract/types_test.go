package contract

import "testing"

func TestTypesShortNamesUnique(t *testing.T) {
	seen := map[string]string{}
	for _, ti := range Types {
		s := ShortType(ti.Type)
		if other, dup := seen[s]; dup {
			t.Errorf("short name %q of %s is also %s's", s, ti.Type, other)
		}
		seen[s] = ti.Type
		if ti.Stream != "config" && ti.Stream != "activity" || ti.Doc == "" {
			t.Errorf("%+v: stream must be config or activity, and Doc set", ti)
		}
	}
}
