// Package optimize is the cross-region optimiser both tiers plan with (the
// global controller each cycle, a region for its fallback plan):
// given each region's ingress demand, capacity and engine latency and the
// RTT between regions, it decides which share of each region's demand is
// served where, and which share is shed. It owns the problem (Problem,
// Validate), the latency model, the objective (Cost), the solver (Solve),
// the local-only baseline (LocalOnly), plan damping (Damp) and the routing
// policy both tiers plan with (SolveLocalFirst): demand stays home while
// a region's own headroom covers it, only the excess is placed by Solve,
// nearest region with room first, and only what nobody can serve is shed.
// Solve alone is the latency optimum, which spills at moderate load when
// a remote region's marginal latency plus the RTT undercuts a loaded
// home's.
//
// SolveSlices plans demand given as slices (source region, band, the
// regions it may be served in): under a shortfall it sheds the highest
// band first (callers pass criticality: sheddable, then standard, then
// critical), max-min fair between the slices of a band, and never routes
// a slice outside its allowed regions (a pinned slice whose regions are
// full is shed, not spilled). Admission is a max-flow per band (admit.go,
// flow.go); what is admitted is routed local-first (sliceroute.go), each
// pinned set a virtual source region of the residual solve that can
// reach only its regions. Input with one unconstrained band plans
// exactly as SolveLocalFirst.
//
// It also owns the what-if format of `isobar global plan`: the JSON input
// (ParseInput, ReadInput: strict, every error naming the offending field
// by its JSON path and matching ErrInvalidInput) and the rounded plan it
// prints (Report, NewReport: shares in whole units of 1e-4 that add up to
// exactly 1 per region). The command only opens the file, calls these and
// prints.
//
// # Concurrency and contracts
//
// Everything here is a pure function: no I/O (ReadInput reads only the
// io.Reader it is given), no clock, no logging, no metrics, no package
// state. Inputs are never modified and results share
// no memory with them, so any function may be called from any number of
// goroutines at once. Solve alone starts goroutines, and joins each
// before it goes on: from 128 regions on, one builds the pricing tables
// (see below) while the start plan is built; from 256 regions on, each
// pricing pass runs half its rows on a second goroutine, the halves merged
// in row order. The plan does not depend on scheduling or GOMAXPROCS (a
// test checks it bit for bit). Bad input (NaN,
// negative or huge numbers, asymmetric RTTs, duplicate names) is refused
// by Problem.Validate with an error wrapping ErrInvalidProblem that names
// the field and region; nothing panics on it.
//
// # Objective
//
// Region i has demand d_i (requests/s), capacity c_i (requests/s at SLO)
// and a low-load engine latency L0_i (ms); headroom h applies to every
// capacity; rtt_ij is the round-trip time in ms (symmetric, rtt_ii = 0,
// +Inf for an unreachable pair). A plan sends x_ij ≥ 0 of i's demand to j
// and sheds s_i ≥ 0 at i, with Σ_j x_ij + s_i = d_i, and costs
//
//	F = Σ_i Σ_j x_ij·(rtt_ij + L_j(load_j)) + P·Σ_i s_i,   load_j = Σ_i x_ij,
//
// where P is the shed penalty (default 10,000 ms per request); demand and
// capacity below MinValue (1e-6 rps) count as 0. Plan.CostMs
// is F divided by the total demand: the mean expected milliseconds per
// request. A region marked down, or with no capacity, receives nothing; a
// down region is not a source either (its demand is ignored and its plan
// row is zero); nothing crosses an unreachable pair.
//
// # Latency model
//
// With u = load/(c·h), the engine latency per request is
//
//	L(u) = L0·(1 + β·u^k/(1−u)),   β = 0.1, k = 4 by default:
//
// flat at low load (at k = 4, half load adds 1.25 %), a knee near capacity,
// like a continuous-batching engine whose TTFT barely moves until the batch
// is full and is then dominated by queueing. L is infinite at u = 1, so no
// plan loads a region to c·h or beyond. Load·L(load) is convex (the
// function u^(k+1)/(1−u) is a power series with non-negative coefficients),
// so F is convex and its minimum is global.
//
// Shedding is the last resort: a region is loaded only as far as its
// marginal latency d(load·L)/d(load) stays below P, which with the defaults
// is about 95 % of c·h for L0 = 300 ms. So the optimiser sheds only when
// total demand approaches what can be served at c·h, sheds rather than
// overloads, and never plans a region at or above c·h.
//
// # Method and optimality gap
//
// Solve is a primal network simplex for this convex cost flow. The flows
// live on a forest of (source, destination) edges plus one shed node per
// source. It starts from a basic plan near the optimum (pool all capacity
// at a common marginal latency, serve locally first, send the excess to
// the nearest regions with pooled room left, shed the rest), or from the
// local-only plan when that costs less. Then it repeats rounds: price every
// source against the current marginal costs rtt_ij + G'_j (G = load·L),
// enter each source's cheapest option where it beats an option in use
// (biggest saving first; an edge joining two trees is added, an edge
// closing a cycle pushes flow around it, which changes RTT only, until a
// tree edge empties), and settle every tree touched. Settling moves a tree
// to the exact optimum of F restricted to its edges: with tree potentials
// pot, every destination takes the load at which its marginal latency is
// λ + pot_j, with λ found by Newton's method so that the loads add up to
// the tree's demand (a water-fill); flows follow from the loads; a ratio
// test keeps flows ≥ 0 and drops edges that empty, and the trees they
// leave are settled in turn. Every step lowers F, so the plan never costs
// more than the local-only plan.
//
// What keeps the rounds cheap:
//
//   - Pricing is exact but does not scan every pair. From 128 regions on,
//     the destinations are grouped into about √(16n) clusters of nearby
//     regions, and those into about √√(16n) groups (farthest-first
//     traversals of the RTTs, once per Solve, with the RTT matrix copied
//     in cluster order: 8·n² more bytes, 8 MB at 1,000 regions). The
//     smallest RTT from a source into a cluster plus the cluster's
//     smallest marginal latency bounds the cost of every option in it, so
//     a cluster (or a group) whose bound exceeds the best option found so
//     far is skipped; each source first scans the cluster of its last
//     cheapest option. The answer, ties included (lowest index), is the
//     full scan's, so the solver takes the same steps; the tests compare
//     the plans bit for bit. The final duality gap is priced the same way.
//   - The tree potentials are kept valid through every pivot (a re-hung
//     subtree is shifted by a constant), so an edge that would close a
//     cycle is tested against them in O(1) and the tree path is walked
//     only for the cycles that pay.
//   - The trees a settle leaves behind when edges empty keep the order,
//     parents and potentials they had in the tree before, so settling
//     them needs no new walk.
//   - Newton's method in a settle starts, for each destination, from the
//     point where its marginal latency was last evaluated (its previous
//     target), moves the loads to second order (with G‴) and λ to match,
//     and stops as soon as the loads it has just evaluated are converged:
//     G' within 1e-13 of λ + pot_j at every destination, and the loads
//     within 1e-13 of the demand. Evaluating G', G″ and G‴ costs one
//     division.
//
// Plan.Gap is the Frank-Wolfe duality gap, Σ_i d_i·(mean marginal cost of
// the options i uses − the cheapest option's), per request: by convexity
// CostMs minus the optimum is at most Gap. Solve stops when Gap ≤
// Tolerance·CostMs (default 1e-6), when no option is cheaper than one in
// use, when rounds stop lowering F (the gap can stay loose when an
// improving region's marginal latency is flat at zero load, as with large
// k; the improvement left is then below float64 resolution), or after
// MaxIterations rounds. Plan.Iterations counts the rounds.
//
// Measured (go test -run '^$' -bench Solve -benchtime 30x -count 3
// ./optimize/, a shared 2-core machine with other work on it;
// random instances with regions on a 10,000 × 5,000 km map, RTT = 2 ms +
// 1 ms per 100 km, capacity 50–500 rps, demand 30–110 % of capacity (70 %
// on average), headroom 0.9; five seeds): 10 regions in 0.08–0.11 ms and
// 100 in 2.3–3.2 ms, both to a relative gap near 1e-14; 1,000 in 135–137
// ms on average (95–110 ms when the machine is otherwise idle; 44 rounds
// on average, 31 to 61 per instance), stopping at the default tolerance
// (relative gap below 1e-6). At 1,000 regions settling takes about 45 %
// of the time, pricing 15 %, entering edges 13 %, and validating,
// starting and building the plan the rest. SolveSlices on the same
// instances at 1.3× the demand, split critical/standard/sheddable with a
// fifth of the regions also sending a pinned slice (BenchmarkSolveSlices),
// takes about 2.5× Solve at 1,000 regions: the residual solve has a
// virtual region per pinned set, and admission adds a few max-flows per
// band and fairness level (about a second at 1,000 regions whose RTTs
// reach only their nearest peers, BenchmarkSolveSlicesSparse). The worked example of the
// design (demand A 90, B 120, C 40 rps, capacity 100, 100, 80) solves in
// one round to a gap of 3e-12 ms.
//
// # Local-only plan and damping
//
// LocalOnly is the baseline: each region serves its own demand up to the
// load where its marginal latency reaches P (just below c·h; serving c·h
// itself would cost +Inf in this model) and sheds the rest.
//
// Damp moves the previous plan toward a new target by a bounded step per
// cycle, a row-wise convex combination, so the global loop converges
// instead of oscillating. Rows the previous plan can no longer use (a
// region went down, demand jumped so that a region would be loaded to
// capacity) take the target's row outright. The damped plan is feasible,
// never costs more than the previous plan on the current problem (convexity)
// and never more than the local-only plan (the step is lengthened if
// needed). DampWithInfo reports the step used and the rows reset.
package optimize
