package statusview

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

const (
	// MaxBody caps one debug answer (10,000 cells are about 20 MB).
	MaxBody = 64 << 20
	// DefaultTimeout bounds each request of a Fetcher without a Timeout.
	DefaultTimeout = 5 * time.Second
	// snippet is how much of a bad answer an error quotes.
	snippet = 120
)

// ErrUnreachable is wrapped by the error of a request that got no HTTP
// answer at all; test with errors.Is. Report errors are strings: it
// shows there as their "cannot reach" prefix.
var ErrUnreachable = errors.New("cannot reach")

// Fetcher reads the debug APIs.
type Fetcher struct {
	// Client makes the requests; nil means http.DefaultClient.
	Client *http.Client
	// Timeout bounds each request; 0 means DefaultTimeout.
	Timeout time.Duration
	// Token, when set, is sent as Authorization: Bearer <Token> (a
	// controller's --admin-token-file).
	Token string
}

// Collect reads every source concurrently and returns them in the order
// given. Failures are recorded in the report (see Report.Failed), never
// returned. When ctx ends, the sources not yet read fail with its error.
func (f Fetcher) Collect(ctx context.Context, controllers, globals []Source) Report {
	rep := Report{
		Controllers: make([]Controller, len(controllers)),
		Globals:     make([]Global, len(globals)),
	}
	var wg sync.WaitGroup
	for i, src := range controllers {
		wg.Go(func() { rep.Controllers[i] = f.controller(ctx, src) })
	}
	for i, src := range globals {
		wg.Go(func() { rep.Globals[i] = f.global(ctx, src) })
	}
	wg.Wait()
	return rep
}

func (f Fetcher) controller(ctx context.Context, src Source) Controller {
	st := Controller{Controller: src.Addr, Cells: []debugapi.CellDebug{}}
	var cells cellsAnswer
	if _, err := f.get(ctx, src.Base+"/debug/cells", &cells, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
		if errors.Is(err, ErrUnreachable) {
			return st // the routes would fail the same way
		}
	} else {
		at := cells.At
		st.At, st.Cycle = &at, cells.Cycle
		if cells.Cells != nil {
			st.Cells = cells.Cells
		}
		slices.SortFunc(st.Cells, func(a, b debugapi.CellDebug) int { return strings.Compare(a.ID, b.ID) })
	}
	var routes debugapi.RouteTable
	if _, err := f.get(ctx, src.Base+"/debug/routes", &routes, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
	} else {
		st.Routes = &routes
	}
	return st
}

func (f Fetcher) global(ctx context.Context, src Source) Global {
	st := Global{Global: src.Addr, Regions: []debugapi.RegionStatus{}}
	var regions regionsAnswer
	if _, err := f.get(ctx, src.Base+"/debug/regions", &regions, false); err != nil {
		st.Errors = append(st.Errors, err.Error())
		if errors.Is(err, ErrUnreachable) {
			return st
		}
	} else {
		st.Leader = regions.Leader
		if regions.Regions != nil {
			st.Regions = regions.Regions
		}
	}
	var raw json.RawMessage
	code, err := f.get(ctx, src.Base+"/debug/plan", &raw, true)
	switch {
	case err != nil:
		st.Errors = append(st.Errors, err.Error())
	case code == http.StatusNotFound:
		// No plan published by this member: {"error": ..., "leader": ...}.
		var none struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &none)
		st.PlanNote = none.Error
		if st.PlanNote == "" {
			st.PlanNote = "no plan"
		}
	default:
		if _, err := parsePlan(raw); err != nil {
			st.Errors = append(st.Errors, fmt.Sprintf("GET %s/debug/plan: not a routing plan: %v", src.Base, err))
			break
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err == nil {
			st.Plan = buf.Bytes()
		}
	}
	return st
}

// parsePlan decodes a routing plan as GET /debug/plan gives it.
func parsePlan(raw []byte) (*isobarpb.RoutingPlan, error) {
	plan := &isobarpb.RoutingPlan{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, plan); err != nil {
		return nil, err
	}
	return plan, nil
}

// get fetches url and decodes its JSON answer into v. A status other than
// 200 is an error, except 404 when allow404 is set (its JSON body is still
// decoded). Errors name the URL and quote the start of a bad answer.
func (f Fetcher) get(ctx context.Context, rawURL string, v any, allow404 bool) (int, error) {
	timeout := f.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	client := f.Client
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", rawURL, err)
	}
	req.Header.Set("Accept", "application/json")
	if f.Token != "" {
		req.Header.Set("Authorization", "Bearer "+f.Token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%w %s: %w", ErrUnreachable, rawURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: reading the answer: %w", rawURL, err)
	}
	if len(body) > MaxBody {
		return resp.StatusCode, fmt.Errorf("GET %s: answer larger than %d bytes", rawURL, MaxBody)
	}
	if resp.StatusCode != http.StatusOK && (resp.StatusCode != http.StatusNotFound || !allow404) {
		return resp.StatusCode, fmt.Errorf("GET %s: HTTP %d: %s", rawURL, resp.StatusCode, quote(body))
	}
	if !json.Valid(body) {
		what := "no content type"
		if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err == nil {
			what = mt
		}
		return resp.StatusCode, fmt.Errorf("GET %s: answered %s, not JSON: %s (is this the --metrics-listen address?)", rawURL, what, quote(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: not the expected JSON: %v: %s", rawURL, err, quote(body))
	}
	return resp.StatusCode, nil
}

// quote quotes the start of a body for an error message.
func quote(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "(empty)"
	}
	more := ""
	if len(b) > snippet {
		b, more = b[:snippet], "..."
	}
	return strconv.Quote(string(b)) + more
}
