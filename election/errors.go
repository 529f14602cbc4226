package election

import "errors"

// Sentinel errors. Check them with errors.Is; the returned errors wrap them
// with context (and, where there is one, the underlying etcd error).
var (
	// ErrNotLeader: a fenced write was refused because the Leadership it
	// named is no longer the leader (its term ended or its key is gone or
	// was replaced). Nothing was written.
	ErrNotLeader = errors.New("election: not leader")
	// ErrNoLeader: Leader found no candidate key under the prefix.
	ErrNoLeader = errors.New("election: no leader")
	// ErrCompareFailed: FencedTxn ran while the Leadership still led, but
	// one of the caller's own comparisons failed; the Else ops ran.
	ErrCompareFailed = errors.New("election: transaction comparison failed")
	// ErrBusy: Campaign or Run was called while this candidate is already
	// campaigning, leading or running.
	ErrBusy = errors.New("election: candidate already campaigning, leading or running")
	// ErrInvalidConfig wraps every configuration error.
	ErrInvalidConfig = errors.New("election: invalid config")
	// ErrClientClosed: the etcd client was closed; Run returns it because
	// no further campaign can succeed.
	ErrClientClosed = errors.New("election: etcd client closed")
	// ErrKeyInPrefix: a fenced write named a key inside the election
	// prefix, where it would be taken for a candidate.
	ErrKeyInPrefix = errors.New("election: key inside the election prefix")
	// ErrSessionLost: the session's lease ended while campaigning.
	ErrSessionLost = errors.New("election: session lost")
)
