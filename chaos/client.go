package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/adminapi"
	"github.com/isobar-mesh/isobar/certs"
)

// Fleet is what a drill needs of its target: observe, inject, heal.
type Fleet interface {
	State(ctx context.Context) (*adminapi.FleetState, error)
	Inject(ctx context.Context, f adminapi.Fault) (adminapi.InjectResult, error)
	Heal(ctx context.Context, f adminapi.Fault) (adminapi.InjectResult, error)
}

// maxAnswer bounds an admin API answer.
const maxAnswer = 8 << 20

// ErrAdmin wraps every error answer of an admin API.
var ErrAdmin = errors.New("chaos: admin API")

// Client is a Fleet reached over an admin API with mTLS.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client of the admin API at addr (host:port or
// https://host:port) presenting the operator certificate certFile/keyFile
// and trusting caFile.
func NewClient(addr, certFile, keyFile, caFile string) (*Client, error) {
	if addr == "" {
		return nil, errors.New("chaos: no admin API address: give --target HOST:PORT (or --lab)")
	}
	tc, err := certs.ClientConfig(certFile, keyFile, caFile, "")
	if err != nil {
		return nil, fmt.Errorf("chaos: operator credentials (--tls-cert, --tls-key, --tls-ca): %w", err)
	}
	base := strings.TrimSuffix(addr, "/")
	if !strings.HasPrefix(base, "https://") {
		if strings.Contains(base, "://") {
			return nil, fmt.Errorf("chaos: --target %q: the admin API is HTTPS only", addr)
		}
		base = "https://" + base
	}
	return &Client{base: base, hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}}, nil
}

// State fetches the fleet's state.
func (c *Client) State(ctx context.Context) (*adminapi.FleetState, error) {
	var st adminapi.FleetState
	if err := c.do(ctx, http.MethodGet, adminapi.PathState, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Inject applies f.
func (c *Client) Inject(ctx context.Context, f adminapi.Fault) (adminapi.InjectResult, error) {
	var res adminapi.InjectResult
	return res, c.do(ctx, http.MethodPost, adminapi.PathInject, f, &res)
}

// Heal undoes f.
func (c *Client) Heal(ctx context.Context, f adminapi.Fault) (adminapi.InjectResult, error) {
	var res adminapi.InjectResult
	return res, c.do(ctx, http.MethodPost, adminapi.PathHeal, f, &res)
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrAdmin, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrAdmin, method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%w: %s %s: HTTP %d: %s", ErrAdmin, method, path, resp.StatusCode, e.Error)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%w: %s %s: undecodable answer: %w", ErrAdmin, method, path, err)
	}
	return nil
}
