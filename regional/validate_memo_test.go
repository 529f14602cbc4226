package regional

import (
	"errors"
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// TestValidMemoRechecksWhatChanged: a stream's memo skips the checks of
// the id and endpoint its last valid heartbeat carried, and of nothing
// else: a changed id or endpoint is checked again, a refused heartbeat
// leaves the memo as it was, and an empty memo checks everything.
func TestValidMemoRechecksWhatChanged(t *testing.T) {
	ready := isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	var m validMemo
	if err := validateHeartbeatOn(heartbeat("a", "127.0.0.1:8000", ready, 1), "r1", &m); err != nil {
		t.Fatal(err)
	}
	if m != (validMemo{id: "a", endpoint: "127.0.0.1:8000"}) {
		t.Fatalf("memo after a valid heartbeat = %+v", m)
	}
	for _, tc := range []struct{ name, id, ep string }{
		{"endpoint changed to a name", "a", "gpu-0:8000"},
		{"endpoint changed to a bad port", "a", "127.0.0.1:0"},
		{"id changed to a bad one", "a/b", "127.0.0.1:8000"},
		{"empty id", "", "127.0.0.1:8000"},
		{"empty endpoint", "a", ""},
	} {
		err := validateHeartbeatOn(heartbeat(tc.id, tc.ep, ready, 2), "r1", &m)
		if !errors.Is(err, ErrInvalidHeartbeat) {
			t.Errorf("%s: err = %v, want ErrInvalidHeartbeat", tc.name, err)
		}
		if m != (validMemo{id: "a", endpoint: "127.0.0.1:8000"}) {
			t.Fatalf("%s: a refused heartbeat moved the memo to %+v", tc.name, m)
		}
	}
	if err := validateHeartbeatOn(heartbeat("a", "127.0.0.1:8001", ready, 3), "r1", &m); err != nil || m.endpoint != "127.0.0.1:8001" {
		t.Fatalf("a valid new endpoint: err %v, memo %+v", err, m)
	}
	// The memo skips only the strings' checks: the rest still holds.
	wrong := heartbeat("a", "127.0.0.1:8001", ready, 4)
	wrong.Region = "r2"
	if err := validateHeartbeatOn(wrong, "r1", &m); !errors.Is(err, ErrWrongRegion) {
		t.Fatalf("wrong region with a memo: %v", err)
	}
}
