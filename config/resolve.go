package config

// LabelBalancingFor returns the label-balancing block that applies to
// workType: its override in work-type-defaults when it has one (the
// override replaces the global block whole; no field is taken from the
// global one), else the global block, else nil, meaning label balancing is
// off for that work type. The result is shared with c and must not be modified.
func (c *Config) LabelBalancingFor(workType string) *LabelBalancingConfig {
	if wt, ok := c.WorkTypeDefaults[workType]; ok && wt.LabelBalancing != nil {
		return wt.LabelBalancing
	}
	return c.LabelBalancing
}

// SetDefaults fills the defaults that depend on what was loaded: today
// include-default (nil means true) on the global label-balancing block and
// on every per-work-type override. It changes nothing else, so turning
// label balancing on never moves another setting away from Defaults().
// Load calls it before Validate.
func (c *Config) SetDefaults() {
	c.LabelBalancing.SetDefaults()
	for _, wt := range c.WorkTypeDefaults {
		wt.LabelBalancing.SetDefaults()
	}
}

// SetDefaults sets IncludeDefault to true when it is unset. A nil block
// (label balancing off) stays nil.
func (lb *LabelBalancingConfig) SetDefaults() {
	if lb == nil || lb.IncludeDefault != nil {
		return
	}
	includeDefault := true
	lb.IncludeDefault = &includeDefault
}
