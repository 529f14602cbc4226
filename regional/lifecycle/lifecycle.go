// Package lifecycle is the replica lifecycle state machine of docs/design.md §3.5:
// Loading → Ready → Draining → Terminated, and any live state → Failed when
// heartbeats stop for the TTL or the engine is unreachable.
//
// It is pure: Next takes the current state and an event and returns the new
// state or an error naming the refused transition. The regional registry
// owns the state of each cell and is the only caller that mutates it.
package lifecycle

import (
	"errors"
	"fmt"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// State is a replica's lifecycle state.
type State uint8

// States. Unknown is the state of a cell the controller has never heard of.
const (
	Unknown State = iota
	Loading
	Ready
	Draining
	Failed
	Terminated
)

var stateNames = [...]string{"unknown", "loading", "ready", "draining", "failed", "terminated"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// States lists every named state, for metrics.
func States() []State { return []State{Loading, Ready, Draining, Failed, Terminated} }

// Serving reports whether a cell in s may receive new requests.
func (s State) Serving() bool { return s == Ready }

// Live reports whether s is a state in which heartbeats are expected.
func (s State) Live() bool { return s == Loading || s == Ready || s == Draining }

// FromProto converts the wire enum.
func FromProto(p isobarpb.LifecycleState) State {
	switch p {
	case isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING:
		return Loading
	case isobarpb.LifecycleState_LIFECYCLE_STATE_READY:
		return Ready
	case isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING:
		return Draining
	case isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED:
		return Failed
	case isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED:
		return Terminated
	default:
		return Unknown
	}
}

// Proto converts to the wire enum.
func (s State) Proto() isobarpb.LifecycleState {
	switch s {
	case Loading:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING
	case Ready:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_READY
	case Draining:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING
	case Failed:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED
	case Terminated:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED
	default:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_UNSPECIFIED
	}
}

// Event is something that can move a cell between states.
type Event uint8

// Events.
const (
	// ReportLoading, ReportReady, ReportDraining, ReportFailed and
	// ReportTerminated: the cell's agent reports what it observes.
	ReportLoading Event = iota
	ReportReady
	ReportDraining
	ReportFailed
	ReportTerminated
	// TTLExpired: no heartbeat for the TTL.
	TTLExpired
	// DrainRequested: an operator asked the controller to drain the cell.
	DrainRequested
	// UndrainRequested: an operator cancelled a drain.
	UndrainRequested
)

var eventNames = [...]string{
	"report_loading", "report_ready", "report_draining", "report_failed",
	"report_terminated", "ttl_expired", "drain_requested", "undrain_requested",
}

func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// ReportEvent maps an agent-reported state to its event. ok is false for
// Unknown.
func ReportEvent(s State) (Event, bool) {
	switch s {
	case Loading:
		return ReportLoading, true
	case Ready:
		return ReportReady, true
	case Draining:
		return ReportDraining, true
	case Failed:
		return ReportFailed, true
	case Terminated:
		return ReportTerminated, true
	default:
		return 0, false
	}
}

// ErrRefused is wrapped by every refused transition; test with errors.Is.
var ErrRefused = errors.New("lifecycle: transition refused")

// Next returns the state after event e in state s. operatorDrain says
// whether an operator drain is in force: it keeps a cell Draining even when
// its agent reports Ready. A refused transition returns s unchanged and an
// error wrapping ErrRefused.
func Next(s State, e Event, operatorDrain bool) (State, error) {
	refuse := func() (State, error) {
		return s, fmt.Errorf("%w: %s in state %s", ErrRefused, e, s)
	}
	switch e {
	case ReportLoading:
		switch s {
		case Unknown, Loading, Failed, Terminated:
			return Loading, nil
		case Draining:
			return Draining, nil
		}
		// Ready → Loading means the engine restarted between two
		// heartbeats: it is not serving, so follow it.
		return Loading, nil
	case ReportReady:
		if operatorDrain {
			if s == Terminated {
				return refuse()
			}
			return Draining, nil
		}
		return Ready, nil
	case ReportDraining:
		if s == Terminated {
			return refuse()
		}
		return Draining, nil
	case ReportFailed:
		if s == Terminated {
			return refuse()
		}
		return Failed, nil
	case ReportTerminated:
		return Terminated, nil
	case TTLExpired:
		if s.Live() {
			return Failed, nil
		}
		return s, nil
	case DrainRequested:
		switch s {
		case Loading, Ready, Draining:
			return Draining, nil
		}
		return refuse()
	case UndrainRequested:
		if s == Draining {
			return Ready, nil
		}
		return refuse()
	}
	return refuse()
}
