package cellagent

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// dcgm-exporter field names the agent reads.
const (
	dcgmGPUUtil         = "DCGM_FI_DEV_GPU_UTIL"
	dcgmFBUsed          = "DCGM_FI_DEV_FB_USED"
	dcgmFBFree          = "DCGM_FI_DEV_FB_FREE"
	dcgmSMActive        = "DCGM_FI_PROF_SM_ACTIVE"
	dcgmTensorActive    = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
	dcgmDRAMActive      = "DCGM_FI_PROF_DRAM_ACTIVE"
	dcgmTemp            = "DCGM_FI_DEV_GPU_TEMP"
	dcgmPower           = "DCGM_FI_DEV_POWER_USAGE"
	dcgmThrottle        = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
	dcgmClocksEvent     = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
	dcgmPrefix          = "DCGM_FI_"
	maxTemperatureC     = 200
	maxPowerWatts       = 5000
	maxSelectableGPUIdx = 1 << 16
)

// HardwareSample is this cell's GPU as read from dcgm-exporter (or NVML). A
// nil field is absent from the source or was dropped as invalid.
type HardwareSample struct {
	// GPUUtil is DCGM_FI_DEV_GPU_UTIL / 100.
	GPUUtil *float64
	// VRAMUsed is FB_USED / (FB_USED + FB_FREE).
	VRAMUsed *float64
	// SMActive is DCGM_FI_PROF_SM_ACTIVE, or PIPE_TENSOR_ACTIVE when the
	// exporter does not serve SM_ACTIVE.
	SMActive *float64
	// DRAMActive is DCGM_FI_PROF_DRAM_ACTIVE.
	DRAMActive *float64
	// TemperatureCelsius is DCGM_FI_DEV_GPU_TEMP.
	TemperatureCelsius *float64
	// PowerWatts is DCGM_FI_DEV_POWER_USAGE.
	PowerWatts *float64
	// ClockThrottleReasons is DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (or the
	// newer DCGM_FI_DEV_CLOCKS_EVENT_REASONS).
	ClockThrottleReasons *uint64
	// Device names the GPU read, e.g. `gpu 0 (GPU-5fd4...)`.
	Device string
	// Invalid describes each value dropped as invalid.
	Invalid []string
}

// gpuSelector picks one GPU: by index (label gpu) or by UUID (label UUID).
// The zero value selects the only GPU.
type gpuSelector struct {
	index int // -1: by UUID or any
	uuid  string
}

// parseGPUSelector reads INDEX or UUID. Empty selects the only GPU.
func parseGPUSelector(s string) (gpuSelector, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return gpuSelector{index: -1}, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n >= maxSelectableGPUIdx {
			return gpuSelector{}, fmt.Errorf("GPU index %d out of range", n)
		}
		return gpuSelector{index: n}, nil
	}
	up := strings.ToUpper(s)
	if !strings.HasPrefix(up, "GPU-") && !strings.HasPrefix(up, "MIG-") {
		return gpuSelector{}, fmt.Errorf("want a GPU index (e.g. 0) or a UUID (GPU-...), got %q", s)
	}
	return gpuSelector{index: -1, uuid: s}, nil
}

func (g gpuSelector) String() string {
	switch {
	case g.uuid != "":
		return "UUID " + g.uuid
	case g.index >= 0:
		return "index " + strconv.Itoa(g.index)
	}
	return "(none)"
}

// gpuKey identifies one GPU (or MIG instance) on a DCGM page.
type gpuKey struct {
	gpu, uuid, instance string
}

func (k gpuKey) String() string {
	s := "gpu " + k.gpu
	if k.uuid != "" {
		s += " (" + k.uuid + ")"
	}
	if k.instance != "" {
		s += " MIG instance " + k.instance
	}
	return s
}

func keyOf(m *dto.Metric) (gpuKey, bool) {
	g, okG := label(m, "gpu")
	u, okU := label(m, "UUID")
	if !okG && !okU {
		return gpuKey{}, false
	}
	i, _ := label(m, "GPU_I_ID")
	return gpuKey{gpu: g, uuid: u, instance: i}, true
}

func (g gpuSelector) matches(k gpuKey) bool {
	switch {
	case g.uuid != "":
		return strings.EqualFold(k.uuid, g.uuid)
	case g.index >= 0:
		n, err := strconv.Atoi(k.gpu)
		return err == nil && n == g.index
	}
	return true
}

// ParseDCGM parses a dcgm-exporter /metrics page and extracts the fields of
// the GPU chosen by selector (a decimal index matched against label gpu, a
// UUID matched against label UUID, or empty for the only GPU on the page).
// It returns an error wrapping ErrParse for a malformed page,
// ErrGPUNotFound when the selector matches no GPU and ErrGPUAmbiguous when
// it matches several (including MIG instances of one GPU). Invalid values
// are dropped and listed in Invalid.
func ParseDCGM(page []byte, selector string) (HardwareSample, error) {
	sel, err := parseGPUSelector(selector)
	if err != nil {
		return HardwareSample{}, err
	}
	mfs, err := parseText(page)
	if err != nil {
		return HardwareSample{}, err
	}
	key, err := selectGPU(mfs, sel)
	if err != nil {
		return HardwareSample{}, err
	}
	r := gpuReader{mfs: mfs, key: key}
	hw := HardwareSample{Device: key.String()}
	r.readUsage(&hw)
	r.readActivity(&hw)
	r.readHealth(&hw)
	hw.Invalid = r.iv
	return hw, nil
}

// gpuReader reads the series of one GPU from a parsed page, listing the
// values it drops in iv.
type gpuReader struct {
	mfs map[string]*dto.MetricFamily
	key gpuKey
	iv  invalids
}

// get returns the value of the series name for the GPU, if present.
func (r *gpuReader) get(name string) (float64, bool) {
	mf := r.mfs[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if k, ok := keyOf(m); ok && k == r.key {
			v, ok := scalar(m)
			if !ok {
				r.iv.addf("%s: unexpected type %s", name, mf.GetType())
			}
			return v, ok
		}
	}
	return 0, false
}

// fraction returns the series name as a fraction in [0,1], or nil when it
// is absent or invalid.
func (r *gpuReader) fraction(name string) *float64 {
	v, ok := r.get(name)
	if !ok {
		return nil
	}
	f, why := checkFraction(v)
	if why != "" {
		r.iv.add(name, v, why)
		return nil
	}
	return ptr(f)
}

// readUsage reads the GPU utilisation and the framebuffer in use.
func (r *gpuReader) readUsage(hw *HardwareSample) {
	if v, ok := r.get(dcgmGPUUtil); ok {
		if f, why := checkFraction(v / 100); why != "" {
			r.iv.add(dcgmGPUUtil, v, "percent "+why)
		} else {
			hw.GPUUtil = ptr(f)
		}
	}
	used, okU := r.get(dcgmFBUsed)
	free, okF := r.get(dcgmFBFree)
	if okU && okF {
		_, whyU := checkCount(used)
		_, whyF := checkCount(free)
		switch {
		case whyU != "":
			r.iv.add(dcgmFBUsed, used, whyU)
		case whyF != "":
			r.iv.add(dcgmFBFree, free, whyF)
		case used+free <= 0:
			r.iv.addf("%s+%s = 0: no framebuffer", dcgmFBUsed, dcgmFBFree)
		default:
			hw.VRAMUsed = ptr(min(used/(used+free), 1))
		}
	}
}

// readActivity reads the SM (or tensor) and DRAM activity.
func (r *gpuReader) readActivity(hw *HardwareSample) {
	if _, ok := r.get(dcgmSMActive); ok {
		hw.SMActive = r.fraction(dcgmSMActive)
	} else {
		hw.SMActive = r.fraction(dcgmTensorActive)
	}
	hw.DRAMActive = r.fraction(dcgmDRAMActive)
}

// readHealth reads the temperature, power and clock throttle reasons.
func (r *gpuReader) readHealth(hw *HardwareSample) {
	if v, ok := r.get(dcgmTemp); ok {
		if t, why := checkRange(v, 0, maxTemperatureC); why != "" {
			r.iv.add(dcgmTemp, v, why)
		} else {
			hw.TemperatureCelsius = ptr(t)
		}
	}
	if v, ok := r.get(dcgmPower); ok {
		if p, why := checkRange(v, 0, maxPowerWatts); why != "" {
			r.iv.add(dcgmPower, v, why)
		} else {
			hw.PowerWatts = ptr(p)
		}
	}
	throttleName := dcgmThrottle
	v, ok := r.get(dcgmThrottle)
	if !ok {
		throttleName = dcgmClocksEvent
		v, ok = r.get(dcgmClocksEvent)
	}
	if ok {
		if mask, why := checkMask(v); why != "" {
			r.iv.add(throttleName, v, why)
		} else {
			hw.ClockThrottleReasons = ptr(mask)
		}
	}
}

// selectGPU finds the one GPU on the page the selector matches.
func selectGPU(mfs map[string]*dto.MetricFamily, sel gpuSelector) (gpuKey, error) {
	seen := map[gpuKey]bool{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, dcgmPrefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			if k, ok := keyOf(m); ok {
				seen[k] = true
			}
		}
	}
	all := make([]gpuKey, 0, len(seen))
	for k := range seen {
		all = append(all, k)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].gpu != all[j].gpu {
			return all[i].gpu < all[j].gpu
		}
		if all[i].uuid != all[j].uuid {
			return all[i].uuid < all[j].uuid
		}
		return all[i].instance < all[j].instance
	})
	if len(all) == 0 {
		return gpuKey{}, fmt.Errorf("%w: the page has no DCGM_FI_ series with a gpu or UUID label", ErrGPUNotFound)
	}
	var match []gpuKey
	for _, k := range all {
		if sel.matches(k) {
			match = append(match, k)
		}
	}
	switch {
	case len(match) == 1:
		return match[0], nil
	case len(match) == 0:
		return gpuKey{}, fmt.Errorf("%w: %s; the exporter serves %s", ErrGPUNotFound, sel, listGPUs(all))
	case sel.index < 0 && sel.uuid == "":
		return gpuKey{}, fmt.Errorf("%w: the exporter serves %d GPUs (%s); choose one by index or UUID (--dcgm-gpu)", ErrGPUAmbiguous, len(all), listGPUs(all))
	default:
		return gpuKey{}, fmt.Errorf("%w: %s matches %s (MIG instances are not supported)", ErrGPUAmbiguous, sel, listGPUs(match))
	}
}

func listGPUs(keys []gpuKey) string {
	const max = 8
	parts := make([]string, 0, min(len(keys), max))
	for i, k := range keys {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-max))
			break
		}
		parts = append(parts, k.String())
	}
	return strings.Join(parts, ", ")
}
