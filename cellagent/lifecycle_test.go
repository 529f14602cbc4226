package cellagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

func TestClassifyHealth(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connect: %w", syscall.ECONNREFUSED)}
	tests := []struct {
		name   string
		status int
		err    error
		phase  enginePhase
		reason string
	}{
		{"200", 200, nil, phaseUp, ""},
		{"503 while loading", 503, nil, phaseLoading, "503"},
		{"404", 404, nil, phaseLoading, "404"},
		{"refused", 0, refused, phaseDown, "connection refused"},
		{"reset", 0, fmt.Errorf("read: %w", syscall.ECONNRESET), phaseDown, "connection reset"},
		{"timeout", 0, fmt.Errorf("get: %w", context.DeadlineExceeded), phaseDown, "timed out after 1s"},
		{"other", 0, errors.New(`Get "http://x/health": dial tcp: lookup x: no such host`), phaseDown, "no such host"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := classifyHealth(tc.status, tc.err, time.Second)
			if p.phase != tc.phase || !strings.Contains(p.reason, tc.reason) {
				t.Fatalf("classifyHealth = %v %q, want %v mentioning %q", p.phase, p.reason, tc.phase, tc.reason)
			}
		})
	}
}

func TestObservedState(t *testing.T) {
	up, loading := engineProbe{phase: phaseUp}, engineProbe{phase: phaseLoading, reason: "health answered 503"}
	down := engineProbe{phase: phaseDown, reason: "engine unreachable: connection refused"}
	tests := []struct {
		name                        string
		p                           engineProbe
		draining, stopping, inGrace bool
		want                        isobarpb.LifecycleState
	}{
		{"ready", up, false, false, false, stateReady},
		{"loading", loading, false, false, false, stateLoading},
		{"down", down, false, false, false, stateFailed},
		{"down in startup grace", down, false, false, true, stateLoading},
		{"drained", up, true, false, false, stateDraining},
		{"drained while loading", loading, true, false, false, stateDraining},
		{"down beats drain", down, true, false, false, stateFailed},
		{"stopping beats all", down, true, true, false, stateTerminated},
		{"not probed yet", engineProbe{}, false, false, false, stateLoading},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := observedState(tc.p, tc.draining, tc.stopping, tc.inGrace)
			if got != tc.want {
				t.Fatalf("state = %v, want %v", got, tc.want)
			}
			if (got == stateReady) != (reason == "") {
				t.Fatalf("state %v with reason %q", got, reason)
			}
		})
	}
}
