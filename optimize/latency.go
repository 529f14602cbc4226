package optimize

import "math"

// server is one destination region's latency model in solver form. With
// C = capacity·headroom and u = y/C:
//
//	L(y)   = L0·(1 + β·u^k/(1−u))          latency per request
//	G(y)   = y·L(y) = L0·y + L0·β·C·f(u)    total latency, f(u) = u^(k+1)/(1−u)
//	G'(y)  = L0 + L0·β·f'(u)                marginal latency
//	G''(y) = L0·β·f''(u)/C
//
// f(u) = Σ_{m≥0} u^(k+1+m) has non-negative derivatives of every order on
// [0, 1), so G, G' are convex and increasing: the problem is convex.
type server struct {
	capEff float64 // C = capacity·headroom (rps); 0: serves nothing
	l0     float64
	beta   float64
	k      float64
	lb     float64 // L0·β
	lbC    float64 // L0·β/C (0 when C is 0)
	lbC2   float64 // L0·β/C²
	ik     int32   // k when it is a small integer, else -1
	usable bool
}

func newServer(r Region, p Problem) server {
	_, capacity, latency := r.resolved()
	s := server{
		capEff: capacity * p.Headroom,
		l0:     latency,
		beta:   p.Beta,
		k:      p.K,
		ik:     -1,
	}
	if p.K == math.Trunc(p.K) && p.K <= 16 {
		s.ik = int32(p.K)
	}
	s.usable = !r.Down && s.capEff > 0
	s.lb = s.l0 * s.beta
	if s.capEff > 0 {
		inv := 1 / s.capEff
		s.lbC = s.lb * inv
		s.lbC2 = s.lbC * inv
	}
	return s
}

// powk returns u^k.
func (s *server) powk(u float64) float64 {
	switch s.ik {
	case 1:
		return u
	case 2:
		return u * u
	case 4:
		u2 := u * u
		return u2 * u2
	case -1:
		return math.Pow(u, s.k)
	}
	r := 1.0
	for e := s.ik; e > 0; e-- {
		r *= u
	}
	return r
}

// util returns u = y/C clamped below at 0.
func (s *server) util(y float64) float64 {
	if y <= 0 {
		return 0
	}
	return y / s.capEff
}

// latency returns L(y) in ms per request; +Inf at or above capacity.
func (s *server) latency(y float64) float64 {
	u := s.util(y)
	if u >= 1 {
		return math.Inf(1)
	}
	return s.l0 * (1 + s.beta*s.powk(u)/(1-u))
}

// total returns G(y) = y·L(y); +Inf at or above capacity.
func (s *server) total(y float64) float64 {
	if y <= 0 {
		return 0
	}
	return y * s.latency(y)
}

// marginal returns G'(y); +Inf at or above capacity.
func (s *server) marginal(y float64) float64 {
	u := s.util(y)
	if u >= 1 {
		return math.Inf(1)
	}
	om := 1 - u
	return s.l0 * (1 + s.beta*s.powk(u)*((s.k+1)-s.k*u)/(om*om))
}

// loadAtMarginal returns the load y in [0, C) at which G'(y) = m (the most
// this server should carry when serving costs more than m at the margin);
// 0 when G'(0) ≥ m.
func (s *server) loadAtMarginal(m float64) float64 {
	if !s.usable || s.marginal(0) >= m {
		return 0
	}
	lo, hi := 0.0, 1.0 // in utilisation
	for range 200 {
		mid := (lo + hi) / 2
		if mid <= lo || mid >= hi {
			break
		}
		if s.marginal(mid*s.capEff) <= m {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo * s.capEff
}

// gh returns G'(y) and G″(y) together (cheaper than marginal plus
// curvature); both +Inf at or above capacity. It is the settling hot path:
// one division.
func (s *server) gh(y float64) (g, h float64) {
	u := s.util(y)
	if u >= 1 {
		return math.Inf(1), math.Inf(1)
	}
	inv := 1 / (1 - u)
	var pk1 float64
	if s.ik == 4 { // the default, inline
		pk1 = u * u * u
	} else {
		pk1 = s.powk1(u)
	}
	pk := pk1 * u
	w := pk * ((s.k + 1) - s.k*u) * inv * inv
	g = s.l0 + s.lb*w
	// G″ = L0·β·(k(k+1)·u^(k−1)/(1−u) + 2·u^k·((k+1)−k·u)/(1−u)³)/C.
	h = (s.k*(s.k+1)*pk1*inv + 2*w*inv) * s.lbC
	return g, h
}

// ght returns G'(y), G″(y) and G‴(y) (+Inf at or above capacity).
func (s *server) ght(y float64) (g, h, t float64) {
	u := s.util(y)
	if u >= 1 {
		return math.Inf(1), math.Inf(1), math.Inf(1)
	}
	inv := 1 / (1 - u)
	var pk2, pk1 float64 // u^(k−2) (0 when k = 1: its factor k−1 is), u^(k−1)
	switch {
	case s.ik == 4: // the default, inline
		pk2 = u * u
		pk1 = pk2 * u
	case s.ik == 1:
		pk1 = 1
	case s.ik > 1:
		pk2 = 1
		for e := s.ik; e > 2; e-- {
			pk2 *= u
		}
		pk1 = pk2 * u
	default:
		pk2 = math.Pow(u, s.k-2)
		pk1 = math.Pow(u, s.k-1)
	}
	pk := pk1 * u
	k := s.k
	kk1 := k * (k + 1)
	w := pk * ((k + 1) - k*u) * inv * inv
	g = s.l0 + s.lb*w
	h = (kk1*pk1*inv + 2*w*inv) * s.lbC
	// f‴(u) = (k−1)k(k+1)·u^(k−2)/(1−u) + 3k(k+1)·u^(k−1)/(1−u)²
	//       + 6(k+1)·u^k/(1−u)³ + 6·u^(k+1)/(1−u)⁴.
	f3 := ((k-1)*kk1*pk2 + (3*kk1*pk1+(6*(k+1)*pk+6*pk*u*inv)*inv)*inv) * inv
	t = f3 * s.lbC2
	return g, h, t
}

// powk1 returns u^(k−1) (1 at u = 0 when k = 1).
func (s *server) powk1(u float64) float64 {
	switch s.ik {
	case 1:
		return 1
	case 2:
		return u
	case 4:
		return u * u * u
	case -1:
		return math.Pow(u, s.k-1)
	}
	r := 1.0
	for e := s.ik; e > 1; e-- {
		r *= u
	}
	return r
}

// loadAt returns the load y in [0, C) with G'(y) = v (0 when v ≤ L0, the
// marginal at no load) and G″(y), by a bracketed Newton search from guess.
func (s *server) loadAt(v, guess float64) (y, h float64) {
	if !s.usable || !(v > s.l0) {
		return 0, 0
	}
	top := s.capEff * (1 - maxUtilGap)
	lo, hi := 0.0, top
	if !(guess > lo && guess < hi) {
		guess = hi / 2
	}
	y = guess
	for range 100 {
		g, gh := s.gh(y)
		h = gh
		if g < v {
			lo = y
		} else {
			hi = y
		}
		if math.Abs(g-v) <= 1e-13*v || hi-lo <= 1e-15*top {
			return y, h
		}
		ny := y - (g-v)/gh
		if !(ny > lo && ny < hi) {
			ny = lo + (hi-lo)/2
		}
		y = ny
	}
	return y, h
}

// maxUtilGap keeps every planned load at most C·(1 − maxUtilGap), where the
// model's latency is finite.
const maxUtilGap = 1e-12

// EngineLatency returns the model's engine latency in ms per request for
// region j of p (defaults applied) at the given load: L0·(1 + β·u^k/(1−u))
// with u = load/(capacity·headroom). It is +Inf at or above
// capacity·headroom and for a region that is down or has no capacity.
func EngineLatency(p Problem, j int, loadRPS float64) float64 {
	q := p.withDefaults()
	s := newServer(q.Regions[j], q)
	if !s.usable {
		return math.Inf(1)
	}
	return s.latency(loadRPS)
}
