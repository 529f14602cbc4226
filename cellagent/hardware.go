package cellagent

import (
	"context"
	"fmt"
)

// hardwareSource reads this cell's GPU: dcgm-exporter over HTTP, or NVML.
type hardwareSource interface {
	// read returns the current sample. It is called from one goroutine at a
	// time.
	read(ctx context.Context) (HardwareSample, error)
	// close releases the source.
	close()
}

// dcgmSource scrapes a dcgm-exporter page.
type dcgmSource struct {
	f        *fetcher
	url      string
	selector string
}

var _ hardwareSource = (*dcgmSource)(nil)

func (d *dcgmSource) read(ctx context.Context) (HardwareSample, error) {
	body, err := d.f.getOK(ctx, d.url, acceptText)
	if err != nil {
		return HardwareSample{}, err
	}
	hw, err := ParseDCGM(body, d.selector)
	if err != nil {
		return HardwareSample{}, fmt.Errorf("%s: %w", d.url, err)
	}
	return hw, nil
}

func (d *dcgmSource) close() {}

// newHardwareSource builds the configured source; nil when none is.
func newHardwareSource(cfg Config, f *fetcher) (hardwareSource, error) {
	switch {
	case cfg.NVML:
		return newNVMLSource(cfg.DCGMGPU)
	case cfg.DCGMURL != "":
		return &dcgmSource{f: f, url: cfg.DCGMURL, selector: cfg.DCGMGPU}, nil
	}
	return nil, nil
}
