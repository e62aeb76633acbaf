package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// writeFile writes a YAML config into a fresh temporary directory and
// returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "workmesh.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLabelBalancing_PerWorkTypeOverride(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		workType string
		want     *LabelBalancingConfig // nil: label balancing off for workType
	}{
		{
			name: "override replaces the global block whole",
			yaml: `
label-balancing: {order: [full, archive], pass-on-error: true, include-default: false}
work-type-defaults:
  sha256:
    label-balancing: {order: [archive, full]}
`,
			workType: "sha256",
			// pass-on-error and include-default come from the override's own
			// defaults, not from the global block.
			want: &LabelBalancingConfig{Order: []string{"archive", "full"}, PassOnError: false, IncludeDefault: boolPtr(true)},
		},
		{
			name: "work type without override gets the global block",
			yaml: `
label-balancing: {order: [full, archive], pass-on-error: true}
work-type-defaults:
  sha256:
    label-balancing: {order: [archive]}
`,
			workType: "echo",
			want:     &LabelBalancingConfig{Order: []string{"full", "archive"}, PassOnError: true, IncludeDefault: boolPtr(true)},
		},
		{
			name: "override entry without a block falls back to the global block",
			yaml: `
label-balancing: {order: [full]}
work-type-defaults:
  sha256: {}
`,
			workType: "sha256",
			want:     &LabelBalancingConfig{Order: []string{"full"}, IncludeDefault: boolPtr(true)},
		},
		{
			name: "override without a global block",
			yaml: `
work-type-defaults:
  sha256:
    label-balancing: {order: [archive], pass-on-error: true, include-default: false}
`,
			workType: "sha256",
			want:     &LabelBalancingConfig{Order: []string{"archive"}, PassOnError: true, IncludeDefault: boolPtr(false)},
		},
		{
			name: "other work type without a global block is off",
			yaml: `
work-type-defaults:
  sha256:
    label-balancing: {order: [archive]}
`,
			workType: "echo",
			want:     nil,
		},
		{name: "no global and no override is off", yaml: "worker-timeout: 1s\n", workType: "sha256", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(LoadOptions{File: writeFile(t, tt.yaml)})
			if err != nil {
				t.Fatal(err)
			}
			got := c.LabelBalancingFor(tt.workType)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("LabelBalancingFor(%q) = %s, want %s", tt.workType, showLB(got), showLB(tt.want))
			}
		})
	}

	// The same resolution on a Config built in code, without Load.
	global := &LabelBalancingConfig{Order: []string{"full"}, PassOnError: true}
	override := &LabelBalancingConfig{Order: []string{"archive"}}
	c := Defaults()
	c.LabelBalancing = global
	c.WorkTypeDefaults = map[string]WorkTypeConfig{"sha256": {LabelBalancing: override}}
	if got := c.LabelBalancingFor("sha256"); got != override {
		t.Errorf("LabelBalancingFor(sha256) = %s, want the override", showLB(got))
	}
	if got := c.LabelBalancingFor("echo"); got != global {
		t.Errorf("LabelBalancingFor(echo) = %s, want the global block", showLB(got))
	}
	d := Defaults()
	if got := d.LabelBalancingFor("sha256"); got != nil {
		t.Errorf("Defaults().LabelBalancingFor(sha256) = %s, want nil", showLB(got))
	}
}

func TestSetDefaults_IncludeDefault(t *testing.T) {
	c := Defaults()
	c.LabelBalancing = &LabelBalancingConfig{Order: []string{"full"}}
	c.WorkTypeDefaults = map[string]WorkTypeConfig{
		"sha256": {LabelBalancing: &LabelBalancingConfig{Order: []string{"archive"}}},
		"echo":   {LabelBalancing: &LabelBalancingConfig{Order: []string{"a"}, IncludeDefault: boolPtr(false)}},
		"sleep":  {},
	}
	c.SetDefaults()
	if lb := c.LabelBalancing; lb.IncludeDefault == nil || !*lb.IncludeDefault {
		t.Errorf("global include-default = %s, want true", showLB(lb))
	}
	if lb := c.LabelBalancingFor("sha256"); lb.IncludeDefault == nil || !*lb.IncludeDefault {
		t.Errorf("sha256 include-default = %s, want true", showLB(lb))
	}
	if lb := c.LabelBalancingFor("echo"); !reflect.DeepEqual(lb.IncludeDefault, boolPtr(false)) {
		t.Errorf("echo include-default = %s, want the explicit false kept", showLB(lb))
	}
	if c.WorkTypeDefaults["sleep"].LabelBalancing != nil {
		t.Error("SetDefaults created a label-balancing block for sleep")
	}
	if c.LabelBalancing.IncludeDefault == c.WorkTypeDefaults["sha256"].LabelBalancing.IncludeDefault {
		t.Error("SetDefaults shares one include-default pointer between blocks")
	}
	off := Defaults()
	off.SetDefaults()
	if !reflect.DeepEqual(off, Defaults()) {
		t.Error("SetDefaults changed Defaults()")
	}
}

// showLB prints a label-balancing block with include-default dereferenced.
func showLB(lb *LabelBalancingConfig) string {
	if lb == nil {
		return "<nil>"
	}
	inc := "<nil>"
	if lb.IncludeDefault != nil {
		inc = fmt.Sprint(*lb.IncludeDefault)
	}
	return fmt.Sprintf("{order: %q, pass-on-error: %t, include-default: %s}", lb.Order, lb.PassOnError, inc)
}
