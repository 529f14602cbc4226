package regional

import "github.com/isobar-mesh/isobar/proto/isobarpb"

// Shared strings. A heartbeat decoded off the wire holds its own copy of
// every string: its cell's id, endpoint, incarnation and model arrive
// anew twice a second. The views, mapping inputs, slots and xDS endpoints
// made from it then hold copies equal to the last cycle's, and every
// comparison the cycle makes to find what changed (keepwrite, the
// changed-cell tests) reads both byte by byte, where one pointer answers
// at once: a sixth of a live 10,000-cell controller's cycle went to such
// comparisons (docs/bench.md). So the registry points each string of a new
// heartbeat that equals its cell's last one at the one it already holds,
// once per heartbeat. Strings are immutable: sharing changes no value.

// maxSharedModels bounds the model names shared across cells: a fleet
// serves a few models, and cells claiming more names than this only miss
// the sharing.
const maxSharedModels = 256

// shareStrings points hb's strings at the equal ones the registry holds:
// its cell's id, the cell's last heartbeat's (old, nil for none), and the
// model name another cell sent (models).
func shareStrings(hb, old *isobarpb.CellHeartbeat, id string, models map[string]string) {
	share(&hb.CellId, id)
	if cp := hb.GetCapability(); cp != nil {
		if m, ok := models[cp.Model]; ok {
			cp.Model = m
		} else if len(models) < maxSharedModels {
			models[cp.Model] = cp.Model
		}
	}
	if old == nil {
		return
	}
	share(&hb.Endpoint, old.Endpoint)
	share(&hb.Incarnation, old.Incarnation)
	share(&hb.Region, old.Region)
	share(&hb.Reason, old.Reason)
	if hb.Vllm != nil && old.Vllm != nil {
		share(&hb.Vllm.Error, old.Vllm.Error)
	}
	if hb.Dcgm != nil && old.Dcgm != nil {
		share(&hb.Dcgm.Error, old.Dcgm.Error)
	}
}

// share sets *dst to held when the two are equal.
func share(dst *string, held string) {
	if *dst == held {
		*dst = held
	}
}
