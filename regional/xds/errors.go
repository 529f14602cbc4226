package xds

import "errors"

// Error classes. Errors returned by this package wrap one of these, or
// xdscontract.ErrInvalidResource for a generated resource that failed
// validation (xdscontract.ValidateDeep, Consistent or the reference check):
// that points at a bug in this package or at a Config that Envoy would
// refuse, and the previous snapshot stays in place. Test with errors.Is.
var (
	// ErrInvalidConfig wraps every error from NewServer and NewBuilder about
	// a Config field.
	ErrInvalidConfig = errors.New("xds: invalid config")
	// ErrInvalidState wraps every refusal of a State (Push, Build): the
	// message lists what is wrong, model by model. The previous snapshot
	// stays in place.
	ErrInvalidState = errors.New("xds: invalid state")
	// ErrStopped is returned by Push and WaitForAck after Stop.
	ErrStopped = errors.New("xds: server stopped")
	// ErrBadVersion is returned by WaitForAck for a version that Push did
	// not return.
	ErrBadVersion = errors.New("xds: bad version")
)
