package workers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestOutcome_EveryOutcomeHasANameAndRoundTrips(t *testing.T) {
	seen := map[string]Outcome{}
	for o := Outcome(1); o < NumOutcomes; o++ {
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
	for _, bad := range []Outcome{0, NumOutcomes, 255} {
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

func TestTruncate(t *testing.T) {
	if got := Truncate("short", 10); got != "short" {
		t.Errorf("got %q", got)
	}
	got := Truncate(strings.Repeat("é", 10), 9) // 2 bytes per rune
	if len(got) > 9 || !strings.HasSuffix(got, "...") || strings.ContainsRune(got, '\uFFFD') {
		t.Errorf("Truncate = %q (%d bytes)", got, len(got))
	}
}

// echo is a handler that returns its payload.
func echo(_ context.Context, payload []byte) Result { return OK(payload) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
