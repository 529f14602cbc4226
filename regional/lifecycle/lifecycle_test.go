package lifecycle

import (
	"errors"
	"testing"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

func TestNext(t *testing.T) {
	tests := []struct {
		from    State
		ev      Event
		drain   bool
		want    State
		refused bool
	}{
		{Unknown, ReportLoading, false, Loading, false},
		{Loading, ReportReady, false, Ready, false},
		{Ready, ReportReady, false, Ready, false},
		{Ready, TTLExpired, false, Failed, false},
		{Loading, TTLExpired, false, Failed, false},
		{Draining, TTLExpired, false, Failed, false},
		{Failed, TTLExpired, false, Failed, false},
		{Terminated, TTLExpired, false, Terminated, false},
		{Ready, ReportFailed, false, Failed, false},
		{Failed, ReportReady, false, Ready, false},
		{Failed, ReportLoading, false, Loading, false},
		{Ready, DrainRequested, false, Draining, false},
		{Draining, ReportReady, true, Draining, false},
		{Draining, UndrainRequested, false, Ready, false},
		{Draining, ReportTerminated, true, Terminated, false},
		{Terminated, ReportReady, false, Ready, false}, // a replaced replica re-registers
		{Terminated, ReportDraining, false, Terminated, true},
		{Terminated, ReportFailed, false, Terminated, true},
		{Failed, DrainRequested, false, Failed, true},
		{Ready, UndrainRequested, false, Ready, true},
	}
	for _, tc := range tests {
		t.Run(tc.from.String()+"/"+tc.ev.String(), func(t *testing.T) {
			got, err := Next(tc.from, tc.ev, tc.drain)
			if got != tc.want {
				t.Errorf("Next(%s, %s) = %s, want %s", tc.from, tc.ev, got, tc.want)
			}
			if refused := errors.Is(err, ErrRefused); refused != tc.refused {
				t.Errorf("refused = %v (err %v), want %v", refused, err, tc.refused)
			}
		})
	}
}

func TestProtoRoundTrip(t *testing.T) {
	for _, s := range States() {
		if got := FromProto(s.Proto()); got != s {
			t.Errorf("FromProto(%s.Proto()) = %s", s, got)
		}
		if _, ok := ReportEvent(s); !ok {
			t.Errorf("ReportEvent(%s) not ok", s)
		}
	}
	if FromProto(isobarpb.LifecycleState(99)) != Unknown {
		t.Error("unknown wire value must map to Unknown")
	}
	if _, ok := ReportEvent(Unknown); ok {
		t.Error("Unknown must not map to an event")
	}
}
