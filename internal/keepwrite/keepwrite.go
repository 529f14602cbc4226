// Package keepwrite owns one decision: a cycle that rewrites a buffer of
// values which mostly did not change writes only those that did.
//
// While the garbage collector marks, every pointer a goroutine stores into
// the heap goes through the write barrier, which queues both the old and
// the new pointer for shading (runtime/mbarrier.go, "the hybrid barrier";
// copies of a struct with pointers go through bulkBarrierPreWrite, one
// queued pair per pointer slot). A regional cycle at 10,000 cells copied
// about a hundred thousand pointers each time (cells' IDs, models, bands,
// endpoints' names) that were already there, and that cost it as much as
// its own work in the cycles a mark overlapped: those cycles are the
// cycle's P99. Comparing first costs a read of memory the write would
// have touched anyway.
//
// The functions are pure; callers own the synchronisation of what they
// write.
package keepwrite

import "slices"

// Set stores v at *dst unless *dst already equals v, and reports whether
// it stored.
func Set[T comparable](dst *T, v T) bool {
	if *dst == v {
		return false
	}
	*dst = v
	return true
}

// Append appends v to s as append does, but where s has room it first
// compares v with the element its backing array already holds at that
// position (what the buffer held when it was last used), and writes only
// when they differ.
func Append[S ~[]E, E comparable](s S, v E) S {
	if n := len(s); n < cap(s) {
		s = s[:n+1]
		Set(&s[n], v)
		return s
	}
	return append(s, v)
}

// Resize returns s with length n and its first min(len(s), n) elements,
// growing it (slices.Grow keeps its elements) when it has not the room:
// a cycle that finds in its buffer what it wrote at a position last time
// can keep it there.
func Resize[S ~[]E, E any](s S, n int) S {
	if n <= len(s) {
		return s[:n]
	}
	return slices.Grow(s, n-len(s))[:n]
}
