package election

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// FencedPut writes key=value only if l is still the leader: a transaction
// If CreateRevision(l.Key) == l.Epoch Then Put. It returns ErrNotLeader
// (errors.Is) and writes nothing when l's term has ended (Done closed; no
// round trip) or etcd finds the key gone or replaced, so a deposed leader
// can never overwrite its successor. Keys inside the election prefix are
// refused with ErrKeyInPrefix.
func FencedPut(ctx context.Context, cli *clientv3.Client, l *Leadership, key, value string) error {
	_, err := FencedTxn(ctx, cli, l, nil, []clientv3.Op{clientv3.OpPut(key, value)}, nil)
	return err
}

// FencedTxn runs a transaction guarded by l's fencing token and by the
// caller's comparisons: If l.Guard() && cmps... Then thenOps Else elseOps.
//
// Results:
//   - success: (resp, nil), resp.Succeeded.
//   - l no longer leads: (resp or nil, ErrNotLeader); thenOps did not run.
//     resp is nil when l's Done was already closed (etcd not contacted).
//   - l leads but one of cmps failed: (resp, ErrCompareFailed); elseOps ran
//     and their results are in resp.Responses.
//   - etcd error: (nil, wrapped error); the outcome is unknown, as for any
//     etcd transaction.
//
// Ops touching the election prefix (including nested transactions and
// ranges that overlap it) are refused with ErrKeyInPrefix.
func FencedTxn(ctx context.Context, cli *clientv3.Client, l *Leadership, cmps []clientv3.Cmp, thenOps, elseOps []clientv3.Op) (*clientv3.TxnResponse, error) {
	if l == nil || l.t == nil {
		return nil, fmt.Errorf("%w: no leadership given", ErrNotLeader)
	}
	for _, ops := range [][]clientv3.Op{thenOps, elseOps} {
		if err := checkOps(l.prefix, ops); err != nil {
			return nil, err
		}
	}
	select {
	case <-l.Done:
		l.m.fencedRefused.Inc()
		return nil, fmt.Errorf("%w: term of epoch %d has ended", ErrNotLeader, l.Epoch)
	default:
	}
	all := make([]clientv3.Cmp, 0, 1+len(cmps))
	all = append(all, l.Guard())
	all = append(all, cmps...)
	els := make([]clientv3.Op, 0, len(elseOps)+1)
	els = append(els, elseOps...)
	els = append(els, clientv3.OpGet(l.Key)) // tells a lost term from a failed cmp
	resp, err := cli.Txn(ctx).If(all...).Then(thenOps...).Else(els...).Commit()
	if err != nil {
		return nil, fmt.Errorf("election: fenced transaction: %w", err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	n := len(resp.Responses)
	if n == 0 {
		return resp, fmt.Errorf("election: fenced transaction: etcd returned no responses for %d else ops", len(els))
	}
	guard := resp.Responses[n-1].GetResponseRange()
	resp.Responses = resp.Responses[:n-1]
	if guard == nil || len(guard.Kvs) == 0 || guard.Kvs[0].CreateRevision != l.Epoch {
		l.m.fencedRefused.Inc()
		return resp, fmt.Errorf("%w: election key of epoch %d is gone or replaced", ErrNotLeader, l.Epoch)
	}
	return resp, ErrCompareFailed
}

// checkOps refuses ops whose key range overlaps the election prefix: a key
// there would be taken for a candidate.
func checkOps(prefix string, ops []clientv3.Op) error {
	for _, op := range ops {
		if op.IsTxn() {
			_, thn, els := op.Txn()
			if err := checkOps(prefix, thn); err != nil {
				return err
			}
			if err := checkOps(prefix, els); err != nil {
				return err
			}
			continue
		}
		if !op.IsPut() && !op.IsDelete() {
			continue
		}
		if overlapsPrefix(string(op.KeyBytes()), string(op.RangeBytes()), prefix) {
			return fmt.Errorf("%w: %q overlaps %q", ErrKeyInPrefix, op.KeyBytes(), prefix)
		}
	}
	return nil
}

// overlapsPrefix reports whether the etcd range [key, end) (a single key
// when end is empty, everything from key on when end is "\x00") shares a
// key with prefix.
func overlapsPrefix(key, end, prefix string) bool {
	if end == "" {
		return strings.HasPrefix(key, prefix)
	}
	pend := clientv3.GetPrefixRangeEnd(prefix)
	if pend != "\x00" && key >= pend {
		return false
	}
	return end == "\x00" || end > prefix
}
