package cellagent

import (
	"context"
	"sync"
)

// OnceReport is the result of ScrapeOnce; `isobar cellagent --once --output
// json` prints it as one JSON object.
type OnceReport struct {
	// State is the lifecycle state the agent would report (READY, LOADING
	// or FAILED), from /health.
	State string `json:"state"`
	// Reason explains State when it is not READY.
	Reason string `json:"reason,omitempty"`
	// Signals from one scrape: TTFT P95, error rate and window requests
	// come from the cumulative histogram and counters (since the engine
	// started); request rate is absent (one scrape has no time base).
	Signals Signals `json:"signals"`
	// Capability is from /v1/models (model from the metrics' model_name
	// label when /v1/models fails).
	Capability Capability  `json:"capability"`
	Sources    OnceSources `json:"sources"`
}

// OnceSources is the health of each source in a OnceReport.
type OnceSources struct {
	VLLM   SourceStatus `json:"vllm"`
	DCGM   SourceStatus `json:"dcgm"`
	Models SourceStatus `json:"models"`
}

// ScrapeOnce scrapes the engine (/metrics, /health, /v1/models) and the GPU
// once, concurrently, and reports what it found. Only the fields ScrapeOnce
// uses are validated (VLLMURL, DCGMURL, DCGMGPU, NVML, ScrapeTimeout,
// MaxBodyBytes, CompletionHandlers); it returns an error only for a bad
// Config. A source that cannot be read or parsed is reported with ok=false
// and its reason.
func ScrapeOnce(ctx context.Context, cfg Config, deps Deps) (OnceReport, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validateScrape(); err != nil {
		return OnceReport{}, err
	}
	if deps.HTTPClient == nil {
		deps.HTTPClient = newHTTPClient()
		defer deps.HTTPClient.CloseIdleConnections()
	}
	deps = deps.withDefaults()
	f := &fetcher{client: deps.HTTPClient, timeout: cfg.ScrapeTimeout, maxBody: cfg.MaxBodyBytes}
	hw, err := newHardwareSource(cfg, f)
	if err != nil {
		return OnceReport{}, err
	}
	if hw != nil {
		defer hw.close()
	}
	healthURL, _ := siblingURL(cfg.VLLMURL, "/health")
	modelsURL, _ := siblingURL(cfg.VLLMURL, "/v1/models")

	var (
		wg       sync.WaitGroup
		hp       engineProbe
		vs       VLLMSample
		verr     error
		ms       ModelsSample
		merr     error
		hs       HardwareSample
		herr     error
		handlers = cfg.CompletionHandlers
	)
	wg.Go(func() {
		code, _, err := f.get(ctx, healthURL, "")
		hp = classifyHealth(code, err, cfg.ScrapeTimeout)
	})
	wg.Go(func() {
		body, err := f.getOK(ctx, cfg.VLLMURL, acceptText)
		if err == nil {
			vs, err = ParseVLLM(body, VLLMOptions{CompletionHandlers: handlers})
		}
		verr = err
	})
	wg.Go(func() {
		body, err := f.getOK(ctx, modelsURL, "application/json")
		if err == nil {
			ms, err = ParseModels(body)
		}
		merr = err
	})
	if hw != nil {
		wg.Go(func() { hs, herr = hw.read(ctx) })
	}
	wg.Wait()

	var r OnceReport
	st, reason := observedState(hp, false, false, false)
	r.State, r.Reason = stateName(st), reason
	if verr != nil {
		r.Sources.VLLM = SourceStatus{Error: verr.Error()}
	} else {
		r.Signals = Derive(nil, vs, 0)
		r.Sources.VLLM = SourceStatus{OK: true, Error: invalids(vs.Invalid).String()}
		r.Capability.Model = vs.Model
	}
	if merr != nil {
		r.Sources.Models = SourceStatus{Error: merr.Error()}
	} else {
		r.Capability = ms.Capability
		r.Sources.Models = SourceStatus{OK: true, Error: invalids(ms.Invalid).String()}
	}
	switch {
	case hw == nil:
		r.Sources.DCGM = SourceStatus{Error: "not configured"}
	case herr != nil:
		r.Sources.DCGM = SourceStatus{Error: herr.Error()}
	default:
		r.Signals = r.Signals.mergeHardware(hs)
		r.Sources.DCGM = SourceStatus{OK: true, Error: invalids(hs.Invalid).String()}
	}
	return r, nil
}
