package completion

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// ErrIncomplete is the error of a stream that answered 200 but ended
// without its [DONE] event; check it with errors.Is. Its text is what the
// harnesses' records carry, so it has no package prefix.
var ErrIncomplete = errors.New("stream ended before [DONE]")

// Clock is the time source a Client measures with; clockwork.Clock
// satisfies it.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
}

// Client sends streaming completions.
type Client struct {
	// HTTP sends the requests. Required.
	HTTP *http.Client
	// Clock measures the time to the first event. Required.
	Clock Clock
	// ErrorBody bounds the bytes of a non-200 answer kept in Result.Body.
	// Default 256.
	ErrorBody int
}

// Request is one streaming request.
type Request struct {
	// URL is the full URL: http://HOST:PORT/v1/completions (or
	// /v1/chat/completions).
	URL string
	// Body is the JSON request, with "stream": true.
	Body []byte
	// PromptTokens, when > 0, is sent as xdscontract.PromptTokensHeader.
	PromptTokens int
	// Start is the origin of the first-event times; zero: when Send
	// starts.
	Start time.Time
	// OnData, when set, gets the payload of every data event but [DONE],
	// in order, from Send's goroutine.
	OnData func(data string)
	// Header holds extra request headers (a request's criticality and
	// tenant, xdscontract.CriticalityHeader and TenantHeader); nil sends
	// none.
	Header http.Header
}

// Result is what the client saw of one request.
type Result struct {
	// Status is the HTTP status; 0 when no answer came (Err says why).
	Status int
	// Header is the answer's header (nil without an answer).
	Header http.Header
	// Endpoint is the endpoint that served the request: the remote
	// region's upstream endpoint when it was forwarded, else the local
	// one. Region is that endpoint's region.
	Endpoint, Region string
	// FirstEvent is the time from Start to the first data event, [DONE]
	// included (0: none, or none measurable); FirstToken to the first data
	// event but [DONE] (meaningful when Events > 0).
	FirstEvent, FirstToken time.Duration
	// Events counts the data events but [DONE].
	Events int
	// OK: HTTP 200 and the stream ended with [DONE].
	OK bool
	// Body is the start of a non-200 answer, trimmed of spaces.
	Body string
	// Err is the transport error (Status 0), the stream's read error, or
	// ErrIncomplete; nil when OK or on a non-200 answer.
	Err error
}

// Send posts req and reads the answer to its end (or ctx's).
func (c *Client) Send(ctx context.Context, req Request) Result {
	if req.Start.IsZero() {
		req.Start = c.Clock.Now()
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return Result{Err: err}
	}
	for k, vs := range req.Header {
		for _, v := range vs {
			hr.Header.Add(k, v)
		}
	}
	hr.Header.Set("Content-Type", "application/json")
	if req.PromptTokens > 0 {
		hr.Header.Set(xdscontract.PromptTokensHeader, strconv.Itoa(req.PromptTokens))
	}
	resp, err := c.HTTP.Do(hr)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode, Header: resp.Header, Region: resp.Header.Get(xdscontract.RegionHeader)}
	res.Endpoint = resp.Header.Get(xdscontract.UpstreamEndpointHeader)
	if res.Endpoint == "" {
		res.Endpoint = resp.Header.Get(xdscontract.EndpointHeader)
	}
	if resp.StatusCode != http.StatusOK {
		limit := c.ErrorBody
		if limit <= 0 {
			limit = 256
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, int64(limit)))
		res.Body = strings.TrimSpace(string(b))
		return res
	}
	c.stream(resp.Body, req, &res)
	return res
}

// stream reads the server-sent events of a 200 answer into res.
func (c *Client) stream(body io.Reader, req Request, res *Result) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if res.FirstEvent == 0 {
			res.FirstEvent = c.Clock.Since(req.Start)
		}
		if data == "[DONE]" {
			res.OK = true
			return
		}
		if res.Events == 0 {
			res.FirstToken = c.Clock.Since(req.Start)
		}
		res.Events++
		if req.OnData != nil {
			req.OnData(data)
		}
	}
	res.Err = sc.Err()
	if res.Err == nil {
		res.Err = ErrIncomplete
	}
}
