package projection

import "time"

// DerateConfig parameterises the hardware derate: the lead signals that a
// GPU is about to slow down (thermal or power throttling) or has a
// hardware fault. A derated cell keeps its band's weight and is published
// with EDS health DEGRADED, so Envoy sends it traffic only when the healthy
// hosts of its priority cannot carry the load (degraded priority load), and
// returns it without a weight ramp.
type DerateConfig struct {
	// On: a thermal score (score.Thermal, normalised: the temperature ramp,
	// 1 when a throttle bit is set) at or above this derates the cell.
	// Default 1 (a throttle bit, or the temperature at score's
	// ThermalMaxC).
	On float64
	// Off: the derate lifts only once the thermal score is at or below
	// this, or absent. Default 0.6 (84 °C with score's defaults). Must be
	// below On: the gap is the hysteresis.
	Off float64
	// MinHold: a derate lasts at least this long after the last reading
	// that called for it, so throttle bits that toggle do not flap the
	// health. Default 10 s.
	MinHold time.Duration
}

// derate is one cell's hardware derate state.
type derate struct {
	active bool
	lastOn time.Time
	why    string
}

// update advances the derate to now and reports whether it is active.
func (d *derate) update(now time.Time, cfg DerateConfig, c Cell) bool {
	on, why := cfg.call(c)
	switch {
	case on:
		d.active, d.lastOn, d.why = true, now, why
	case d.active:
		still := c.ThermalOK && c.Thermal > cfg.Off
		if !still && now.Sub(d.lastOn) >= cfg.MinHold {
			d.active, d.why = false, ""
		}
	}
	return d.active
}

// call reports whether c's signals call for a derate now, and why; calls
// is the first of the two.
func (cfg DerateConfig) call(c Cell) (on bool, why string) {
	switch {
	case c.HardwareFault:
		return true, "hardware fault reported"
	case c.ThermalOK && c.Thermal >= cfg.On:
		return true, "thermal/power throttling (thermal score at or above the derate threshold)"
	}
	return false, ""
}

func (cfg DerateConfig) calls(c Cell) bool { on, _ := cfg.call(c); return on }
