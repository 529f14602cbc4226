package gateway

import "errors"

// Error classes. Errors returned by this package wrap one of these; test
// with errors.Is.
var (
	// ErrInvalidConfig wraps every error from New and NewWatcher about a
	// Config (or WatchConfig) field or a missing dependency.
	ErrInvalidConfig = errors.New("gateway: invalid config")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("gateway: already started")
	// ErrStopped is returned by Start after Stop, and by the wait functions
	// once the gateway or watcher has stopped.
	ErrStopped = errors.New("gateway: stopped")
	// ErrInvalidResource wraps the reason an xDS response was refused
	// (NACKed): it failed validation or uses a feature the gateway cannot
	// honour. The previous resources of that type stay in use.
	ErrInvalidResource = errors.New("gateway: invalid xDS resource")
	// ErrBadRequest wraps the reason a client request was refused before
	// routing (body too large, not JSON, model not a string).
	ErrBadRequest = errors.New("gateway: bad request")
)
