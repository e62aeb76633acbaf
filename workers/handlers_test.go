package workers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOutcome_EveryOutcomeHasANameAndRoundTrips(t *testing.T) {
	seen := map[string]Outcome{}
	for o := Outcome(1); o < numOutcomes; o++ {
		name := o.String()
		if name == "" || strings.HasPrefix(name, "outcome(") {
			t.Fatalf("outcome %d has no name", uint8(o))
		}
		if prev, dup := seen[name]; dup {
			t.Fatalf("outcomes %d and %d share the name %q", uint8(prev), uint8(o), name)
		}
		seen[name] = o
		text, err := o.MarshalText()
		if err != nil {
			t.Fatalf("MarshalText(%v): %v", o, err)
		}
		var back Outcome
		if err := back.UnmarshalText(text); err != nil || back != o {
			t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, o)
		}
	}
	for _, bad := range []Outcome{0, numOutcomes, 255} {
		if bad.Valid() {
			t.Errorf("Outcome(%d).Valid() = true", uint8(bad))
		}
		if _, err := bad.MarshalText(); !errors.Is(err, ErrUnknownOutcome) {
			t.Errorf("MarshalText(%d) error = %v, want ErrUnknownOutcome", uint8(bad), err)
		}
	}
	var o Outcome
	if err := o.UnmarshalText([]byte("great")); !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("UnmarshalText(great) error = %v, want ErrUnknownOutcome", err)
	}
}

func TestBuiltinHandlers(t *testing.T) {
	reg, err := NewBuiltinRegistry()
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
		want       Outcome
		wantOutput string
		wantErr    string // substring of the message
	}{
		{name: "echo", workType: "echo", payload: "hello", want: Success, wantOutput: "hello"},
		{name: "echo empty", workType: "echo", payload: "", want: Success, wantOutput: ""},
		{name: "sha256", workType: "sha256", payload: "abc", want: Success,
			wantOutput: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{name: "sha256 empty", workType: "sha256", payload: "", want: Success,
			wantOutput: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{name: "sleep", workType: "sleep", payload: "1ms", want: Success, wantOutput: "slept 1ms"},
		{name: "sleep zero", workType: "sleep", payload: "0s", want: Success, wantOutput: "slept 0s"},
		{name: "sleep spaces", workType: "sleep", payload: " 2ms\n", want: Success, wantOutput: "slept 2ms"},
		{name: "sleep not a duration", workType: "sleep", payload: "soon", want: PermanentError, wantErr: `payload "soon" is not a duration`},
		{name: "sleep bare number", workType: "sleep", payload: "150", want: PermanentError, wantErr: "not a duration"},
		{name: "sleep negative", workType: "sleep", payload: "-5ms", want: PermanentError, wantErr: "negative"},
		{name: "sleep huge", workType: "sleep", payload: "61s", want: PermanentError, wantErr: "longer than the maximum 1m0s"},
		{name: "sleep cancelled", ctx: cancelled, workType: "sleep", payload: "1m", want: RetryableError, wantErr: "cancelled"},
		{name: "unknown type", workType: "resize", payload: "x", want: Unsupported,
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
			if tt.want == Success && string(res.Output) != tt.wantOutput {
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
	done := make(chan Result, 1)
	go func() { done <- sleep(ctx, []byte("1m")) }()
	cancel()
	select {
	case res := <-done:
		if res.Outcome != RetryableError || !strings.Contains(res.Error, "cancelled") {
			t.Fatalf("result = %v %q, want a retryable 'cancelled' error", res.Outcome, res.Error)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sleep did not return after its context was cancelled")
	}
}

func TestRegistry_Register(t *testing.T) {
	r := NewRegistry()
	h := HandlerFunc(echo)
	if err := r.Register("b-type", h); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("a.type_2", h); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		handler Handler
		want    error
	}{
		{"", h, ErrInvalidType},
		{"has space", h, ErrInvalidType},
		{"slash/y", h, ErrInvalidType},
		{strings.Repeat("x", MaxTypeLen+1), h, ErrInvalidType},
		{"b-type", h, ErrDuplicateType},
	}
	for _, tt := range tests {
		if err := r.Register(tt.name, tt.handler); !errors.Is(err, tt.want) {
			t.Errorf("Register(%q) error = %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := r.Register("nil", nil); err == nil {
		t.Error("Register with a nil handler succeeded")
	}
	if got, want := r.Names(), []string{"a.type_2", "b-type"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	if _, ok := r.Get("b-type"); !ok {
		t.Error("Get(b-type) not found")
	}
	if _, ok := r.Get("c"); ok {
		t.Error("Get(c) found")
	}
	if err := r.Register(strings.Repeat("x", MaxTypeLen), h); err != nil {
		t.Errorf("a name of exactly MaxTypeLen bytes: %v", err)
	}
}

func TestNewBuiltinRegistry_Subset(t *testing.T) {
	r, err := NewBuiltinRegistry("sha256")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Names(); !slices.Equal(got, []string{"sha256"}) {
		t.Errorf("Names() = %v, want [sha256]", got)
	}
	if _, err := NewBuiltinRegistry("echo", "resize"); !errors.Is(err, ErrInvalidType) || !strings.Contains(err.Error(), "echo, sha256, sleep") {
		t.Errorf("unknown built-in: error = %v, want ErrInvalidType listing the built-ins", err)
	}
}

type headHandler struct {
	HandlerFunc
	head  uint64
	known bool
}

func (h headHandler) Head() (uint64, bool) { return h.head, h.known }

func TestRegistry_Head(t *testing.T) {
	r := NewRegistry()
	must(t, r.Register("blocks", headHandler{HandlerFunc: echo, head: 42, known: true}))
	must(t, r.Register("fresh", headHandler{HandlerFunc: echo}))
	must(t, r.Register("echo", HandlerFunc(echo)))
	tests := []struct {
		name   string
		head   uint64
		wantOK bool
	}{
		{"blocks", 42, true},
		{"fresh", 0, false},
		{"echo", 0, false},
		{"missing", 0, false},
	}
	for _, tt := range tests {
		head, ok := r.Head(tt.name)
		if head != tt.head || ok != tt.wantOK {
			t.Errorf("Head(%s) = %d, %v; want %d, %v", tt.name, head, ok, tt.head, tt.wantOK)
		}
	}
}

func TestRegistry_DoRecoversPanicsAndInvalidOutcomes(t *testing.T) {
	r := NewRegistry()
	must(t, r.Register("sha256", HandlerFunc(func(context.Context, []byte) Result { panic("boom") })))
	must(t, r.Register("lazy", HandlerFunc(func(context.Context, []byte) Result { return Result{} })))
	res := r.Do(context.Background(), "sha256", nil)
	if res.Outcome != PermanentError || res.Error != "handler sha256 panicked: boom" {
		t.Errorf("panicking handler: %v %q", res.Outcome, res.Error)
	}
	res = r.Do(context.Background(), "lazy", nil)
	if res.Outcome != PermanentError || !strings.Contains(res.Error, "invalid outcome") {
		t.Errorf("zero result: %v %q, want a permanent error", res.Outcome, res.Error)
	}
}

func TestTruncateUTF8(t *testing.T) {
	if got := truncateUTF8("short", 10); got != "short" {
		t.Errorf("got %q", got)
	}
	got := truncateUTF8(strings.Repeat("é", 10), 9) // 2 bytes per rune
	if len(got) > 9 || !strings.HasSuffix(got, "...") || strings.ContainsRune(got, '\uFFFD') {
		t.Errorf("truncateUTF8 = %q (%d bytes)", got, len(got))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
