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
		res      onceResults
		handlers = cfg.CompletionHandlers
	)
	wg.Go(func() {
		code, _, err := f.get(ctx, healthURL, "")
		res.hp = classifyHealth(code, err, cfg.ScrapeTimeout)
	})
	wg.Go(func() {
		body, err := f.getOK(ctx, cfg.VLLMURL, acceptText)
		if err == nil {
			res.vs, err = ParseVLLM(body, VLLMOptions{CompletionHandlers: handlers})
		}
		res.verr = err
	})
	wg.Go(func() {
		body, err := f.getOK(ctx, modelsURL, "application/json")
		if err == nil {
			res.ms, err = ParseModels(body)
		}
		res.merr = err
	})
	if hw != nil {
		wg.Go(func() { res.hs, res.herr = hw.read(ctx) })
	}
	wg.Wait()
	return res.report(hw != nil), nil
}

// onceResults is what ScrapeOnce's reads returned.
type onceResults struct {
	hp   engineProbe
	vs   VLLMSample
	verr error
	ms   ModelsSample
	merr error
	hs   HardwareSample
	herr error
}

// report folds the results into a report; hwConfigured says whether a GPU
// source was read.
func (res *onceResults) report(hwConfigured bool) OnceReport {
	var r OnceReport
	st, reason := observedState(res.hp, false, false, false)
	r.State, r.Reason = stateName(st), reason
	if res.verr != nil {
		r.Sources.VLLM = SourceStatus{Error: res.verr.Error()}
	} else {
		r.Signals = Derive(nil, res.vs, 0)
		r.Sources.VLLM = SourceStatus{OK: true, Error: invalids(res.vs.Invalid).String()}
		r.Capability.Model = res.vs.Model
	}
	if res.merr != nil {
		r.Sources.Models = SourceStatus{Error: res.merr.Error()}
	} else {
		r.Capability = res.ms.Capability
		r.Sources.Models = SourceStatus{OK: true, Error: invalids(res.ms.Invalid).String()}
	}
	switch {
	case !hwConfigured:
		r.Sources.DCGM = SourceStatus{Error: "not configured"}
	case res.herr != nil:
		r.Sources.DCGM = SourceStatus{Error: res.herr.Error()}
	default:
		r.Signals = r.Signals.mergeHardware(res.hs)
		r.Sources.DCGM = SourceStatus{OK: true, Error: invalids(res.hs.Invalid).String()}
	}
	return r
}
