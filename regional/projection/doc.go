// Package projection turns each cell's lifecycle state and slow signals into
// the integer endpoint weight and EDS health the data plane receives
// (docs/design.md §3.3, issue 13).
//
// # What a weight means
//
// A weight says whether a cell is eligible and how much capacity it has,
// never how loaded it is right now. Scraped load signals (queue depth,
// running batch, KV-cache use, TTFT, RTT, jitter) are 0.5–10 s old by the
// time they could reach a weight, while the data plane knows its own
// in-flight requests now; so those signals stay in the pressure score (for
// explanation, alerts and the regional summary) and Cell.Pressure does not
// move the weight. A weight comes from:
//
//   - lifecycle and ramps: only Ready and Draining cells have weight; a
//     Draining cell's capacity fraction falls linearly to 0 over DrainRamp;
//   - the error-rate penalty: a tripped cell is out of the load balancer,
//     then on count-bounded probation (below);
//   - hardware derates: thermal or power throttling (the thermal score at
//     Derate.On, lifted at Derate.Off after at least Derate.MinHold) or a
//     reported hardware fault (Cell.HardwareFault, a hook no heartbeat
//     fills yet) publish the endpoint with EDS health DEGRADED at an
//     unchanged weight, rather than a fractional weight;
//   - the measured relative speed (capacity class), Cell.Speed: a hook;
//     the registry has no measurement yet, so every cell counts as full
//     speed;
//   - capability: a cell whose max_model_len is too small for a request is
//     left out of that request's context-class cluster (regional/xds, where
//     every declared max_model_len is a class of its own). A cell below its
//     model's longest declared context (Cell.ContextShare < 1) publishes
//     weight 1 in the model's main cluster, which takes requests of unknown
//     size, and its band weight as Weight.ClassWeight in the class clusters
//     whose prompts it holds.
//
// # Bands
//
// The capacity fraction f = speed × ramp is quantised into Config.Bands
// bands (default 3): band k has weight MaxWeight/2^k (100, 50, 25). The
// edge between bands k−1 and k is 2^−(k−½) (0.707, 0.354); a cell leaves
// its band only when f is beyond the edge by BandHysteresis of it (10 %), so
// a value wandering around an edge changes the band at most once. Identical
// healthy cells are all in band "full" and push identical weights, which
// keeps Envoy's least-request balancer on its unweighted path (P2C or full
// scan over active requests) instead of its per-worker EDF schedule.
// Weight.Band and Weight.BandReason say which band a cell is in and why;
// the regional /debug/cells view shows them.
//
// # Penalty and probation
//
// An error rate above ErrorThreshold on at least MinRequests requests trips
// a penalty: the cell leaves the load balancer for a hold (BaseHold,
// doubling per consecutive trip up to MaxHold, extended while errors are
// still reported). There is no share-based floor. After the hold the cell is
// on probation: each hold window opens with one probe slot in which the cell
// is published at the lowest band's weight until it has reported
// ProbeRequests requests or ProbeSlot has passed; otherwise it is out. One
// failing request on probation trips it again (with a doubled hold);
// requests within the threshold clear the penalty.
//
// The control plane counts probes from the cell's heartbeats, so the slot
// closes up to one heartbeat interval (plus a push) after the N-th probe
// was sent: at a rate λ to the cell, about λ × that lag more requests may
// reach it (stock Envoy can do no better). For an exact bound the data
// plane must count: during a slot Weight.ProbeBudget is N, published as
// endpoint metadata filter_metadata["isobar"]["probe_budget"]
// (xdscontract.MetadataProbeBudget), and a data plane that honours it sends
// the endpoint at most that many requests while the assignment holds it.
// isobar's gateway honours it under --lb isobar (gateway/balance.go,
// placeable); stock Envoy and the gateway's other modes ignore it.
//
// # Publishing
//
// A change of the set of cells in the load balancer (a cell becomes Ready,
// fails, finishes draining, a probe slot opens or closes), a newly tripped
// penalty or a derate change is pushed at once; any other band change at
// most once per MinInterval.
//
// # Cost
//
// A projection evaluates every cell that is not settled (settled.go): one
// with nothing in its state that moves with time and its target published
// keeps its target and weight while the inputs that could move them stay
// the same, so a cycle in which most cells' load moved costs what changed.
//
// # Concurrency
//
// A Projector holds the weights last published and each cell's penalty,
// derate and band; it does no I/O and reads no clock (now is an argument).
// It is not safe for concurrent use: the regional registry goroutine owns it.
package projection
