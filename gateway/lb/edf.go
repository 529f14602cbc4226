package lb

// EDF is Envoy's earliest-deadline-first scheduler
// (source/common/upstream/edf_scheduler.h, EdfScheduler<C>), used for
// weighted round robin and for weighted least request.
//
// Each entry has a deadline; a pick takes the entry with the earliest
// deadline (ties: the one added first, Envoy's order_offset_), moves the
// scheduler's current time to that deadline and, in PickAndAdd, re-adds the
// entry with deadline = current time + 1/weight, where weight is computed at
// that moment. An entry's weight is therefore only ever read when it is
// added: it goes stale until the entry is next picked.
//
// Entries are host indexes. Envoy holds weak pointers and skips expired ones
// lazily; here the owner rebuilds the scheduler when its host set changes
// (as Envoy's refresh does), so no entry ever expires. Envoy's peekAgain and
// its pre-pick list (used only for preconnecting) are not modelled.
//
// An EDF is not safe for concurrent use.
type EDF struct {
	now   float64 // current_time_
	order uint64  // order_offset_
	queue []edfEntry
}

type edfEntry struct {
	deadline float64
	order    uint64
	host     int
}

// before is EdfEntry::operator< flipped: std::priority_queue pops the entry
// with the smallest deadline, then the smallest order_offset_. (deadline,
// order) is a strict total order, so the pick sequence does not depend on
// the heap's implementation.
func (e edfEntry) before(o edfEntry) bool {
	return e.deadline < o.deadline || (e.deadline == o.deadline && e.order < o.order)
}

// maxPrePicks is createWithPicks' cap on emulated picks (UINT_MAX/10).
const maxPrePicks = 429496729

// prePickEpsilon is the epsilon createWithPicks adds to every weight while
// emulating picks, so that weights that are multiples of each other do not
// produce deadlines a rounding error away from the ones step-by-step picking
// would have produced (Envoy PR 31592).
const prePickEpsilon = 1e-13

// NewEDF returns an empty scheduler at time 0.
func NewEDF() *EDF { return &EDF{} }

// NewEDFWithPicks is EdfScheduler::createWithPicks: the scheduler holding
// hosts (added in slice order) as it would be after picks calls of
// PickAndAdd with unchanged weights, built in O(n) plus fewer than len(hosts)
// real picks. picks is first reduced modulo 429496729, as Envoy does.
// weight must be positive for every host.
//
// The emulation follows Envoy's arithmetic step by step: every weight is
// augmented by 1e-13; host i is credited floor(P·w_i/W) picks (one fewer
// when floating point makes that credit reach P/W), giving it deadline
// (p_i+1)/w_i and order i; the current time is the largest p_i/w_i; the
// remaining picks are then made one by one with the unaugmented weights.
func NewEDFWithPicks(hosts []int, weight func(host int) float64, picks uint32) *EDF {
	picks %= maxPrePicks
	s := &EDF{}
	if len(hosts) == 0 {
		return s
	}
	aug := func(h int) float64 { return weight(h) + prePickEpsilon }
	var sum float64
	for _, h := range hosts {
		sum += aug(h)
	}
	s.queue = make([]edfEntry, 0, len(hosts))
	var picksSoFar uint32
	var maxPickTime float64
	p := float64(picks)
	for i, h := range hosts {
		w := aug(h)
		floor := uint32(w * p / sum) // static_cast<uint32_t>(w * picks / weights_sum)
		if floor > 0 && float64(floor)/w >= p/sum {
			floor--
		}
		pickTime := float64(floor) / w
		s.queue = append(s.queue, edfEntry{deadline: float64(floor+1) / w, order: uint64(i), host: h})
		maxPickTime = max(maxPickTime, pickTime)
		picksSoFar += floor
	}
	for i := len(s.queue)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
	s.now = maxPickTime
	s.order = uint64(len(hosts))
	for ; picksSoFar < picks; picksSoFar++ {
		s.PickAndAdd(weight)
	}
	return s
}

// Len is the number of entries in the scheduler.
func (s *EDF) Len() int { return len(s.queue) }

// Now is the scheduler's current time: the deadline of the last pick.
func (s *EDF) Now() float64 { return s.now }

// Add inserts host with deadline Now()+1/weight after every entry already
// holding that deadline (EdfScheduler::add). Envoy asserts weight > 0; a
// zero weight gives an infinite deadline here, as it does in an Envoy
// release build.
func (s *EDF) Add(weight float64, host int) {
	s.queue = append(s.queue, edfEntry{deadline: s.now + 1.0/weight, order: s.order, host: host})
	s.order++
	s.up(len(s.queue) - 1)
}

// PickAndAdd is EdfScheduler::pickAndAdd without pre-picks: it pops the
// entry with the earliest deadline, advances Now to it, re-adds the entry
// with weight(host) evaluated now, and returns the host. ok is false when
// the scheduler is empty.
func (s *EDF) PickAndAdd(weight func(host int) float64) (host int, ok bool) {
	if len(s.queue) == 0 {
		return -1, false
	}
	top := s.queue[0]
	s.now = top.deadline
	// Pop and push in one step: replace the root and sift it down.
	s.queue[0] = edfEntry{deadline: s.now + 1.0/weight(top.host), order: s.order, host: top.host}
	s.order++
	s.down(0)
	return top.host, true
}

func (s *EDF) up(i int) {
	q := s.queue
	for i > 0 {
		parent := (i - 1) / 2
		if !q[i].before(q[parent]) {
			return
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (s *EDF) down(i int) {
	q := s.queue
	n := len(q)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q[r].before(q[l]) {
			m = r
		}
		if !q[m].before(q[i]) {
			return
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
}
