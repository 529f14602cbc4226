package xdsclient

import "errors"

// Error classes. Errors returned by this package wrap one of these; test
// with errors.Is.
var (
	// ErrInvalidConfig wraps every error from NewWatcher about a
	// WatchConfig field or a missing dependency.
	ErrInvalidConfig = errors.New("xdsclient: invalid config")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("xdsclient: already started")
	// ErrStopped is returned by the wait functions once the watcher has
	// stopped.
	ErrStopped = errors.New("xdsclient: stopped")
	// ErrInvalidResource wraps the reason an xDS response was refused
	// (NACKed): it failed validation or uses a feature the gateway cannot
	// honour. The previous resources of that type stay in use.
	ErrInvalidResource = errors.New("xdsclient: invalid xDS resource")
)
