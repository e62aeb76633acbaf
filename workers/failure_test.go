package workers

import (
	"strings"
	"testing"
	"time"
)

func TestDetailRoundTrip(t *testing.T) {
	d := Detail{ExitCode: 3, HasExitCode: true, Stderr: strings.Repeat("é", 2000), HTTPStatus: 422, Body: "no", RetryAfter: 1500 * time.Millisecond}
	r := Fail(PermanentError, "failed").WithDetail(d)
	got := DetailOf(r)
	if got == nil || got.ExitCode != 3 || !got.HasExitCode || got.HTTPStatus != 422 || got.Body != "no" ||
		got.RetryAfter != 1500*time.Millisecond || len(got.Stderr) > MaxDetailText || !strings.HasPrefix(got.Stderr, "éé") {
		t.Fatalf("DetailOf = %+v", got)
	}
	if DetailOf(OK([]byte("x"))) != nil || DetailOf(Fail(RetryableError, "plain")) != nil {
		t.Fatal("a detail found where none was given")
	}
	if r := OK([]byte("out")).WithDetail(d); string(r.Output) != "out" {
		t.Fatalf("WithDetail changed a success: %q", r.Output)
	}
	// An output that merely looks like one is not taken for a detail.
	r.Output = r.Output[:len(r.Output)-1]
	if DetailOf(r) != nil {
		t.Fatal("a cut detail decoded")
	}
	if d := DetailOf(Fail(PermanentError, "x").WithDetail(Detail{})); d == nil || d.HasExitCode {
		t.Fatalf("empty detail: %+v", d)
	}
}
