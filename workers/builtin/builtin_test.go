package builtin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/workmesh/workmesh/workers"
)

func TestBuiltinHandlers(t *testing.T) {
	reg, err := NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name       string
		ctx        context.Context
		workType   string
		payload    string
		want       workers.Outcome
		wantOutput string
		wantErr    string // substring of the message
	}{
		{name: "echo", workType: "echo", payload: "hello", want: workers.Success, wantOutput: "hello"},
		{name: "echo empty", workType: "echo", payload: "", want: workers.Success, wantOutput: ""},
		{name: "sha256", workType: "sha256", payload: "abc", want: workers.Success,
			wantOutput: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{name: "sha256 empty", workType: "sha256", payload: "", want: workers.Success,
			wantOutput: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{name: "sleep", workType: "sleep", payload: "1ms", want: workers.Success, wantOutput: "slept 1ms"},
		{name: "sleep zero", workType: "sleep", payload: "0s", want: workers.Success, wantOutput: "slept 0s"},
		{name: "sleep spaces", workType: "sleep", payload: " 2ms\n", want: workers.Success, wantOutput: "slept 2ms"},
		{name: "sleep not a duration", workType: "sleep", payload: "soon", want: workers.PermanentError, wantErr: `payload "soon" is not a duration`},
		{name: "sleep bare number", workType: "sleep", payload: "150", want: workers.PermanentError, wantErr: "not a duration"},
		{name: "sleep negative", workType: "sleep", payload: "-5ms", want: workers.PermanentError, wantErr: "negative"},
		{name: "sleep huge", workType: "sleep", payload: "61s", want: workers.PermanentError, wantErr: "longer than the maximum 1m0s"},
		{name: "sleep cancelled", ctx: cancelled, workType: "sleep", payload: "1m", want: workers.RetryableError, wantErr: "cancelled"},
		{name: "unknown type", workType: "resize", payload: "x", want: workers.Unsupported,
			wantErr: `work type "resize" is not served here (served: echo, sha256, sleep)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			res := reg.Do(ctx, tt.workType, []byte(tt.payload))
			if res.Outcome != tt.want {
				t.Fatalf("outcome = %v (%s), want %v", res.Outcome, res.Error, tt.want)
			}
			if tt.want == workers.Success && string(res.Output) != tt.wantOutput {
				t.Errorf("output = %q, want %q", res.Output, tt.wantOutput)
			}
			if !strings.Contains(res.Error, tt.wantErr) {
				t.Errorf("error = %q, want it to contain %q", res.Error, tt.wantErr)
			}
		})
	}
}

func TestSleep_StopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan workers.Result, 1)
	go func() { done <- sleep(ctx, []byte("1m")) }()
	cancel()
	select {
	case res := <-done:
		if res.Outcome != workers.RetryableError || !strings.Contains(res.Error, "cancelled") {
			t.Fatalf("result = %v %q, want a retryable 'cancelled' error", res.Outcome, res.Error)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sleep did not return after its context was cancelled")
	}
}

func TestNewRegistry_Subset(t *testing.T) {
	r, err := NewRegistry("sha256")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Names(); !slices.Equal(got, []string{"sha256"}) {
		t.Errorf("Names() = %v, want [sha256]", got)
	}
	if _, err := NewRegistry("echo", "resize"); !errors.Is(err, workers.ErrInvalidType) || !strings.Contains(err.Error(), "echo, sha256, sleep") {
		t.Errorf("unknown built-in: error = %v, want workers.ErrInvalidType listing the built-ins", err)
	}
}

// TestTraits: every built-in type may be hedged and is deterministic.
func TestTraits(t *testing.T) {
	reg, err := NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	c := Catalog()
	for _, name := range Types() {
		h, _ := reg.Get(name)
		tr := workers.TraitsOf(h)
		if tr.Idempotent == nil || !tr.Idempotent([]byte("x")) || !tr.Deterministic {
			t.Errorf("%s: traits %+v, want idempotent and deterministic", name, tr)
		}
		if !c.Idempotent(name, nil) {
			t.Errorf("catalog: %s not idempotent", name)
		}
	}
}
