package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// model is the served model name of the interop fleet; gRPC clients dial
// xds:///<model>.
const model = "interop-m"

// fleet is a real regional controller with real cellagents, each beside a
// simulated engine, advertising a real gRPC backend.
type fleet struct {
	ctrl, http string
	regional   *proc
	cells      []*cell
}

type cell struct {
	id            string
	backend       *backend
	engine, agent *proc
	admin         string // the sim engine's fault API (host:port)
}

// adminToken is the sim engines' fault-API bearer token.
const adminToken = "interop-admin-token-0123456789"

// startFleet starts `isobar regional --lb-policy policy` and n cells and
// waits until every cell carries a weight.
func startFleet(t *testing.T, policy string, n int) *fleet {
	t.Helper()
	f := &fleet{ctrl: freeAddr(t), http: freeAddr(t)}
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(adminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	f.regional = start(t, "regional", nil, nil, isobarBin, "regional", "--region", "r1", "--listen", f.ctrl,
		"--metrics-listen", f.http, "--insecure", "--lb-policy", policy, "--heartbeat-interval", "250ms")
	waitDial(t, f.ctrl)
	for i := range n {
		c := &cell{id: fmt.Sprintf("cell-%d", i), backend: startBackend(t, fmt.Sprintf("b%d", i)), admin: freeAddr(t)}
		api, dcgm := freeAddr(t), freeAddr(t)
		c.engine = start(t, c.id+"-engine", nil, nil, isobarBin, "sim", "engine", "--listen", api, "--dcgm-listen", dcgm,
			"--gpu-index", strconv.Itoa(i), "--model", model, "--time-scale", "0.2", "--seed", strconv.Itoa(i+1),
			"--admin-listen", c.admin, "--admin-token-file", tokenFile)
		waitDial(t, api)
		waitDial(t, dcgm)
		c.agent = start(t, c.id+"-agent", nil, nil, isobarBin, "cellagent", "--cell-id", c.id, "--region", "r1",
			"--controller", f.ctrl, "--vllm-url", "http://"+api+"/metrics", "--dcgm-url", "http://"+dcgm+"/metrics",
			"--advertise", c.backend.addr, "--insecure", "--interval", "250ms")
		f.cells = append(f.cells, c)
	}
	poll(t, "every cell weighted", 60*time.Second, func() (bool, string) {
		ws, err := f.weights()
		if err != nil {
			return false, err.Error()
		}
		for _, c := range f.cells {
			if ws[c.backend.name] == 0 {
				return false, fmt.Sprint(ws)
			}
		}
		return true, ""
	})
	return f
}

// weights returns the controller's published weight per backend name.
func (f *fleet) weights() (map[string]uint32, error) {
	body, err := httpGet("http://" + f.http + "/debug/cells")
	if err != nil {
		return nil, err
	}
	var v struct {
		Cells []struct {
			ID       string `json:"id"`
			Endpoint string `json:"endpoint"`
			Weight   uint32 `json:"weight"`
			Degraded bool   `json:"degraded"`
		} `json:"cells"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		return nil, err
	}
	out := make(map[string]uint32)
	for _, c := range v.Cells {
		for _, fc := range f.cells {
			if fc.id == c.ID {
				out[fc.backend.name] = c.Weight
			}
		}
	}
	return out, nil
}

// fault injects a fault through cell c's sim engine admin API.
func (f *fleet) fault(t *testing.T, c *cell, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.admin+"/admin/faults", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fault %s on %s: %s", body, c.id, resp.Status)
	}
}

// degraded reports whether the controller publishes cell id as DEGRADED.
func (f *fleet) degraded(id string) (bool, error) {
	body, err := httpGet("http://" + f.http + "/debug/cells/" + id)
	if err != nil {
		return false, err
	}
	var v struct {
		Degraded bool `json:"degraded"`
	}
	return v.Degraded, json.Unmarshal([]byte(body), &v)
}

// drain asks the controller to drain cell id.
func (f *fleet) drain(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.http+"/v1/cells/"+id+"/drain", nil)
	// The admin API refuses a POST that is not JSON (no simple cross-site
	// request may drive it, SECURITY.md).
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("drain %s: %s", id, resp.Status)
	}
}

// counter sums the samples of metric in the controller's /metrics whose
// labels contain every label of match ("" matches all), by label set.
func (f *fleet) counter(t *testing.T, metric string) map[string]float64 {
	t.Helper()
	body, err := httpGet("http://" + f.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return samples(body, metric)
}

// samples returns the values of metric in Prometheus text, by label set.
func samples(body, metric string) map[string]float64 {
	out := make(map[string]float64)
	for _, ln := range strings.Split(body, "\n") {
		if !strings.HasPrefix(ln, metric) || strings.HasPrefix(ln, "#") {
			continue
		}
		rest := ln[len(metric):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer metric name
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err == nil {
			out[labels] += v
		}
	}
	return out
}
