package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node/apiv1"
)

// TestDispatch_ARequestStartsFromNothingOfTheOneBefore: the state of a
// request's attempts (reused from request to request) holds nothing of
// the request before it: after a request whose remote attempts failed,
// one that no worker serves has no attempt, and one of the same type
// lists only its own.
func TestDispatch_ARequestStartsFromNothingOfTheOneBefore(t *testing.T) {
	a, b := NewFakePeer(nil, "echo"), NewFakePeer(nil, "echo")
	d := testDispatcher(t, config.Defaults(), a, b)
	req := WorkRequest{Type: "echo", Payload: []byte("x"), Timeout: 5 * time.Second}
	first := d.Dispatch(context.Background(), req)
	if first.Status != apiv1.StatusOK || len(first.Attempts) < 2 {
		t.Fatalf("first request: %s with %d attempts (%+v); want ok after failed remote attempts", first.Status, len(first.Attempts), first.Attempts)
	}
	none := d.Dispatch(context.Background(), WorkRequest{Type: "nothing-serves-this", Payload: []byte("x"), Timeout: 5 * time.Second})
	if none.Status != apiv1.StatusUnavailable || len(none.Attempts) != 0 {
		t.Fatalf("a type nobody serves: %s with attempts %+v; want unavailable with none", none.Status, none.Attempts)
	}
	again := d.Dispatch(context.Background(), req)
	if again.Status != apiv1.StatusOK || len(again.Attempts) > len(first.Attempts) {
		t.Fatalf("the same request again: %s with %d attempts, the first had %d", again.Status, len(again.Attempts), len(first.Attempts))
	}
}
