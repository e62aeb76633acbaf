package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/workmesh/workmesh/node/apiv1"
)

// TestPrintPlan_HedgeDelay: with hedging on, the limits line says the
// work type's hedge delay and whether it is measured.
func TestPrintPlan_HedgeDelay(t *testing.T) {
	for _, c := range []struct {
		limits apiv1.PlanLimits
		want   string
	}{
		{apiv1.PlanLimits{MaxRemoteWorkers: 3, MaxRetries: 2}, "limits: max-remote-workers 3, max-retries 2\n"},
		{apiv1.PlanLimits{MaxRemoteWorkers: 3, MaxRetries: 2, HedgeMaxCount: 1, HedgeDelayMS: 12.5, HedgeDelayMeasured: true},
			"limits: max-remote-workers 3, max-retries 2, hedges 1 after 12.5ms (measured)\n"},
		{apiv1.PlanLimits{MaxRemoteWorkers: 3, MaxRetries: 2, HedgeMaxCount: 1, HedgeDelayMS: 100},
			"limits: max-remote-workers 3, max-retries 2, hedges 1 after 100ms (hedge-delay)\n"},
	} {
		var b bytes.Buffer
		printPlan(&b, apiv1.PlanView{WorkType: "sha256", Mode: "rating", Limits: c.limits})
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("plan with limits %+v:\n%s\nwant a line %q", c.limits, b.String(), c.want)
		}
	}
}
