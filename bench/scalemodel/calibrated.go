package scalemodel

// CalibratedSource names the run Calibrated was fitted on.
const CalibratedSource = "PENDING"

// Calibrated is the frozen constants (placeholder until fitted).
func Calibrated() Params { return Params{} }
