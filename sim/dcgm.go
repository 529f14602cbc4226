package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of DCGMConfig.
const (
	DefaultDCGMHostname      = "localhost"
	DefaultDCGMDriverVersion = "535.129.03"
)

// DCGMConfig configures a fake dcgm-exporter.
type DCGMConfig struct {
	// Hostname is the Hostname label. Default DefaultDCGMHostname.
	Hostname string
	// DriverVersion is the DCGM_FI_DRIVER_VERSION label. Default
	// DefaultDCGMDriverVersion.
	DriverVersion string
}

func (c DCGMConfig) withDefaults() DCGMConfig {
	if c.Hostname == "" {
		c.Hostname = DefaultDCGMHostname
	}
	if c.DriverVersion == "" {
		c.DriverVersion = DefaultDCGMDriverVersion
	}
	return c
}

// dcgmField is one exported DCGM field.
type dcgmField struct {
	name, help string
	typ        prometheus.ValueType
	value      func(GPUSample) float64
}

// dcgmFields are served in this order with dcgm-exporter's names, types and
// help texts.
var dcgmFields = []dcgmField{
	{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.SMClockMHz }},
	{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.MemClockMHz }},
	{"DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.MemTempC }},
	{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.GPUTempC }},
	{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.PowerW }},
	{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", prometheus.CounterValue, func(s GPUSample) float64 { return s.EnergyMJ }},
	{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.UtilPct }},
	{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.MemCopyUtilPct }},
	{"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", prometheus.GaugeValue, func(s GPUSample) float64 { return s.XID }},
	{"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.FBFreeMiB }},
	{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.FBUsedMiB }},
	{"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons.", prometheus.GaugeValue, func(s GPUSample) float64 { return float64(s.ThrottleReasons) }},
	{"DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned (in %).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.SMActive }},
	{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active (in %).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.TensorActive }},
	{"DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data (in %).", prometheus.GaugeValue, func(s GPUSample) float64 { return s.DRAMActive }},
	{"DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", prometheus.GaugeValue, func(s GPUSample) float64 { return s.PCIeTxBytes }},
	{"DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", prometheus.GaugeValue, func(s GPUSample) float64 { return s.PCIeRxBytes }},
}

// dcgmLabels are dcgm-exporter's per-GPU labels.
var dcgmLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}

// dcgmCollector reads every GPU at scrape time.
type dcgmCollector struct {
	x     *DCGMExporter
	descs []*prometheus.Desc
}

func (c *dcgmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *dcgmCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.x.GPUs() {
		info, s := g.GPUInfo(), g.GPUSample()
		lv := []string{strconv.Itoa(info.Index), info.UUID, info.PCIBusID, info.Device, info.ModelName, c.x.cfg.Hostname, c.x.cfg.DriverVersion}
		for i, f := range dcgmFields {
			ch <- prometheus.MustNewConstMetric(c.descs[i], f.typ, f.value(s), lv...)
		}
	}
}

// DCGMExporter is a fake dcgm-exporter serving /metrics for any number of
// GPUs (one exporter per node serves every GPU on it). SetDown closes its
// listener (connection refused) until it is brought back on the same
// address. Safe for concurrent use.
type DCGMExporter struct {
	cfg DCGMConfig
	log *slog.Logger
	reg *prometheus.Registry
	// regErr is the error of registering the collector, if any: Start
	// returns it and /metrics serves it, since NewDCGMExporter has no
	// error return.
	regErr error

	life sync.Mutex // serialises Start, SetDown and Stop

	mu      sync.Mutex
	gpus    []GPUSource
	addr    string
	srv     *http.Server
	wg      sync.WaitGroup
	started bool
	down    bool
	stopped bool
}

// NewDCGMExporter returns an exporter for the given GPUs (more can be added
// with AddGPU). It never panics: should its collector fail to register,
// Start returns that error.
func NewDCGMExporter(cfg DCGMConfig, deps Deps, gpus ...GPUSource) *DCGMExporter {
	deps = deps.withDefaults()
	x := &DCGMExporter{cfg: cfg.withDefaults(), log: deps.Logger.With("component", "dcgm"), gpus: gpus}
	c := &dcgmCollector{x: x}
	for _, f := range dcgmFields {
		c.descs = append(c.descs, prometheus.NewDesc(f.name, f.help, dcgmLabels, nil))
	}
	x.reg = prometheus.NewRegistry()
	if err := x.reg.Register(c); err != nil {
		x.regErr = fmt.Errorf("sim: dcgm exporter: register metrics: %w", err)
	}
	return x
}

// AddGPU adds a GPU to the exporter.
func (x *DCGMExporter) AddGPU(g GPUSource) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.gpus = append(x.gpus, g)
}

// GPUs returns the exported GPUs.
func (x *DCGMExporter) GPUs() []GPUSource {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]GPUSource(nil), x.gpus...)
}

// Handler serves /metrics and /health (for embedding in another server).
func (x *DCGMExporter) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		if x.regErr != nil {
			http.Error(w, x.regErr.Error(), http.StatusInternalServerError)
			return
		}
		serveText(w, x.reg)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// Start serves on ln and returns at once; the exporter owns ln.
func (x *DCGMExporter) Start(ln net.Listener) error {
	x.life.Lock()
	defer x.life.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.regErr != nil:
		return x.regErr
	case x.stopped:
		return fmt.Errorf("sim: dcgm exporter: %w", ErrStopped)
	case x.started:
		return fmt.Errorf("sim: dcgm exporter: %w", ErrAlreadyStarted)
	}
	x.started = true
	x.addr = ln.Addr().String()
	x.serveLocked(ln)
	x.log.Info("dcgm exporter started", "addr", x.addr)
	return nil
}

func (x *DCGMExporter) serveLocked(ln net.Listener) {
	srv := &http.Server{Handler: x.Handler(), ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(x.log.Handler(), slog.LevelDebug)}
	x.srv = srv
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			x.log.Error("dcgm exporter serve failed", "err", err)
		}
	}()
}

// Addr returns the listen address ("" before Start).
func (x *DCGMExporter) Addr() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.addr
}

// Down reports whether the exporter is down.
func (x *DCGMExporter) Down() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.down
}

// SetDown takes the exporter down (its listener and connections close:
// scrapes get connection refused) or brings it back on the same address.
func (x *DCGMExporter) SetDown(down bool) error {
	x.life.Lock()
	defer x.life.Unlock()
	x.mu.Lock()
	if !x.started || x.stopped || x.down == down {
		x.mu.Unlock()
		if !x.started {
			return fmt.Errorf("sim: dcgm exporter: %w", ErrNotStarted)
		}
		return nil
	}
	if down {
		srv := x.srv
		x.srv, x.down = nil, true
		x.mu.Unlock()
		_ = srv.Close()
		x.wg.Wait()
		x.log.Warn("dcgm exporter down")
		return nil
	}
	addr := x.addr
	x.mu.Unlock()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: dcgm exporter back on %s: %w", addr, err)
	}
	x.mu.Lock()
	x.down = false
	x.serveLocked(ln)
	x.mu.Unlock()
	x.log.Info("dcgm exporter up")
	return nil
}

// Stop closes the exporter for good and waits for its goroutine.
// Idempotent.
func (x *DCGMExporter) Stop(ctx context.Context) error {
	x.life.Lock()
	defer x.life.Unlock()
	x.mu.Lock()
	srv := x.srv
	x.srv, x.stopped = nil, true
	x.mu.Unlock()
	var err error
	if srv != nil {
		if err = srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	x.wg.Wait()
	return err
}
