package config

import (
	"slices"
	"testing"
)

// TestEverySettingHasAGroup fails when a setting that flags can set has no
// group for `node start --help`, or a group FlagGroups does not list.
func TestEverySettingHasAGroup(t *testing.T) {
	names := make([]string, 0, len(FlagGroups))
	for _, g := range FlagGroups {
		names = append(names, g.Name)
	}
	for _, st := range mustSchema().settings {
		g := GroupOfFlag(st.flag)
		if g == "" {
			t.Errorf("setting %s has no group", st.key)
		} else if !slices.Contains(names, g) {
			t.Errorf("setting %s: group %q is not in FlagGroups", st.key, g)
		}
	}
	for key := range group {
		if mustSchema().byKey[key] == nil {
			t.Errorf("group names %q, which is no setting", key)
		}
	}
	if GroupOfFlag("no-such-flag") != "" {
		t.Error("a flag of no setting has a group")
	}
}
