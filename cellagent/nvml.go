//go:build nvml

package cellagent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLSupported reports whether this binary reads GPUs through NVML (built
// with -tags nvml).
const NVMLSupported = true

// nvmlSource reads one GPU through NVML. NVML has no SM-active or
// DRAM-active fields outside the GPM API, so those signals stay absent.
type nvmlSource struct {
	mu     sync.Mutex
	dev    nvml.Device
	name   string
	closed bool
}

var _ hardwareSource = (*nvmlSource)(nil)

func newNVMLSource(selector string) (hardwareSource, error) {
	sel, err := parseGPUSelector(selector)
	if err != nil {
		return nil, err
	}
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("cellagent: nvml init: %v", ret)
	}
	dev, name, err := nvmlDevice(sel)
	if err != nil {
		_ = nvml.Shutdown()
		return nil, err
	}
	return &nvmlSource{dev: dev, name: name}, nil
}

func nvmlDevice(sel gpuSelector) (nvml.Device, string, error) {
	switch {
	case sel.uuid != "":
		dev, ret := nvml.DeviceGetHandleByUUID(sel.uuid)
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("%w: UUID %s: %v", ErrGPUNotFound, sel.uuid, ret)
		}
		return dev, "UUID " + sel.uuid, nil
	case sel.index >= 0:
		dev, ret := nvml.DeviceGetHandleByIndex(sel.index)
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("%w: index %d: %v", ErrGPUNotFound, sel.index, ret)
		}
		return dev, fmt.Sprintf("gpu %d", sel.index), nil
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("cellagent: nvml device count: %v", ret)
	}
	if n != 1 {
		return nil, "", fmt.Errorf("%w: NVML sees %d GPUs; choose one by index or UUID (--dcgm-gpu)", ErrGPUAmbiguous, n)
	}
	dev, ret := nvml.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("%w: index 0: %v", ErrGPUNotFound, ret)
	}
	return dev, "gpu 0", nil
}

func (s *nvmlSource) read(context.Context) (HardwareSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return HardwareSample{}, errors.New("cellagent: nvml source closed")
	}
	hw := HardwareSample{Device: s.name}
	var iv invalids
	var errs []error
	if u, ret := s.dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		if f, why := checkFraction(float64(u.Gpu) / 100); why != "" {
			iv.add("nvml utilization.gpu", float64(u.Gpu), why)
		} else {
			hw.GPUUtil = ptr(f)
		}
	} else {
		errs = append(errs, fmt.Errorf("utilization: %v", ret))
	}
	if m, ret := s.dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		if m.Used+m.Free > 0 {
			hw.VRAMUsed = ptr(min(float64(m.Used)/float64(m.Used+m.Free), 1))
		}
	} else {
		errs = append(errs, fmt.Errorf("memory: %v", ret))
	}
	if t, ret := s.dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		if v, why := checkRange(float64(t), 0, maxTemperatureC); why != "" {
			iv.add("nvml temperature", float64(t), why)
		} else {
			hw.TemperatureCelsius = ptr(v)
		}
	}
	if p, ret := s.dev.GetPowerUsage(); ret == nvml.SUCCESS {
		if v, why := checkRange(float64(p)/1000, 0, maxPowerWatts); why != "" {
			iv.add("nvml power", float64(p)/1000, why)
		} else {
			hw.PowerWatts = ptr(v)
		}
	}
	if r, ret := s.dev.GetCurrentClocksEventReasons(); ret == nvml.SUCCESS {
		hw.ClockThrottleReasons = ptr(r)
	} else if r, ret := s.dev.GetCurrentClocksThrottleReasons(); ret == nvml.SUCCESS {
		hw.ClockThrottleReasons = ptr(r)
	}
	hw.Invalid = iv
	if len(errs) == 2 {
		return HardwareSample{}, fmt.Errorf("cellagent: nvml %s: %w", s.name, errors.Join(errs...))
	}
	return hw, nil
}

func (s *nvmlSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		_ = nvml.Shutdown()
	}
}
