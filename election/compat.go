package election

import (
	"strings"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// NewElection returns etcd's concurrency.Election for prefix, written in
// either form ("/a/election" or "/a/election/"; "" is DefaultPrefix). Its
// keys are the keys Candidate uses, so the two interoperate.
//
// Upstream NewElection appends "/" to its argument (so "/a/election/"
// would become "/a/election//"), while upstream ResumeElection uses its
// argument as is (etcd PR #10297): a resumed election on "/a/election"
// then reads "/a/election*" and can take a key of a sibling election such
// as "/a/election-other/..." for its leader. Use these two wrappers
// instead of the upstream constructors.
func NewElection(s *concurrency.Session, prefix string) *concurrency.Election {
	return concurrency.NewElection(s, strings.TrimSuffix(normalizePrefix(prefix), "/"))
}

// ResumeElection returns etcd's concurrency.Election resumed at a known
// leader key and its create revision, with the prefix normalised as in
// NewElection (see there for why).
func ResumeElection(s *concurrency.Session, prefix, leaderKey string, leaderRev int64) *concurrency.Election {
	return concurrency.ResumeElection(s, normalizePrefix(prefix), leaderKey, leaderRev)
}
