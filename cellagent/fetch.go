package cellagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Errors of the HTTP sources. Check them with errors.Is.
var (
	// ErrBodyTooLarge: a response body exceeded Config.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("cellagent: response body too large")
	// ErrHTTPStatus: a scrape answered with a non-200 status.
	ErrHTTPStatus = errors.New("cellagent: unexpected HTTP status")
)

// fetcher performs bounded HTTP GETs.
type fetcher struct {
	client  *http.Client
	timeout time.Duration
	maxBody int64
}

func newHTTPClient() *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  false,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

// get fetches url and returns the status code and the body (read whole, up
// to maxBody). A transport error returns status 0.
func (f *fetcher) get(ctx context.Context, url, accept string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.maxBody+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("reading body: %w", err)
	}
	if int64(len(body)) > f.maxBody {
		return resp.StatusCode, nil, fmt.Errorf("%w: %s exceeds %d bytes (MaxBodyBytes)", ErrBodyTooLarge, url, f.maxBody)
	}
	return resp.StatusCode, body, nil
}

// getOK fetches url and insists on status 200.
func (f *fetcher) getOK(ctx context.Context, url, accept string) ([]byte, error) {
	code, body, err := f.get(ctx, url, accept)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %d %s", ErrHTTPStatus, url, code, http.StatusText(code))
	}
	return body, nil
}

// The Accept header of a Prometheus scrape in the text format.
const acceptText = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"

// enginePhase is what a /health probe found.
type enginePhase int

const (
	_ enginePhase = iota // unknown: no probe yet
	// phaseUp: /health answered 200.
	phaseUp
	// phaseLoading: reachable, /health answered another status.
	phaseLoading
	// phaseDown: unreachable, or /health timed out.
	phaseDown
)

func (p enginePhase) String() string {
	switch p {
	case phaseUp:
		return "up"
	case phaseLoading:
		return "loading"
	case phaseDown:
		return "down"
	}
	return "unknown"
}

// engineProbe is the result of one /health probe.
type engineProbe struct {
	phase    enginePhase
	reason   string
	seq      uint64 // order in which probes started; a later one wins
	timedOut bool   // the probe got no answer within the timeout
}

// reachable reports whether the engine's port answered.
func (p engineProbe) reachable() bool { return p.phase == phaseUp || p.phase == phaseLoading }

// classifyHealth maps a /health answer (status, or transport error) to an
// engine phase.
func classifyHealth(status int, err error, timeout time.Duration) engineProbe {
	switch {
	case err != nil && isTimeout(err):
		return engineProbe{phase: phaseDown, reason: fmt.Sprintf("health probe timed out after %v", timeout), timedOut: true}
	case err != nil:
		return engineProbe{phase: phaseDown, reason: "engine unreachable: " + describeNetErr(err)}
	case status == http.StatusOK:
		return engineProbe{phase: phaseUp}
	default:
		return engineProbe{phase: phaseLoading, reason: fmt.Sprintf("health answered %d %s", status, http.StatusText(status))}
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// describeNetErr shortens a transport error to its cause.
func describeNetErr(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	s := err.Error()
	// url.Error prefixes `Get "http://...": `; the cause is what matters.
	if i := strings.LastIndex(s, ": "); i >= 0 && i+2 < len(s) {
		return s[i+2:]
	}
	return s
}

// observedState is the lifecycle state the agent reports. stopping wins,
// then an engine that is down (LOADING while the startup grace lasts), then
// a drain, then what /health says.
func observedState(p engineProbe, draining, stopping, inGrace bool) (isobarpb.LifecycleState, string) {
	switch {
	case stopping:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_TERMINATED, "agent stopped"
	case p.phase == phaseDown && inGrace:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, "engine not reachable yet (startup grace): " + p.reason
	case p.phase == phaseDown:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_FAILED, p.reason
	case draining:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_DRAINING, "drain requested by controller"
	case p.phase == phaseUp:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_READY, ""
	case p.phase == phaseLoading:
		return isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, p.reason
	}
	return isobarpb.LifecycleState_LIFECYCLE_STATE_LOADING, "engine not probed yet"
}
