package gateway

import (
	"errors"

	"github.com/isobar-mesh/isobar/gateway/xdsclient"
)

// Error classes. Errors returned by this package wrap one of these; test
// with errors.Is.
var (
	// ErrInvalidConfig wraps every error from New (and gateway/extproc's
	// New) about a Config field or a missing dependency.
	ErrInvalidConfig = errors.New("gateway: invalid config")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("gateway: already started")
	// ErrStopped is returned by Start after Stop, and by the wait functions
	// once the gateway has stopped.
	ErrStopped = errors.New("gateway: stopped")
	// ErrInvalidResource wraps the reason an xDS response was refused
	// (NACKed): it failed validation or uses a feature the gateway cannot
	// honour. The previous resources of that type stay in use. It is
	// package xdsclient's class, which decodes the responses.
	ErrInvalidResource = xdsclient.ErrInvalidResource
	// ErrBadRequest wraps the reason a client request was refused before
	// routing (body too large, not JSON, model not a string).
	ErrBadRequest = errors.New("gateway: bad request")
)
