package interop

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listening returns the loopback TCP addresses process pid listens on,
// from ss (iproute2): the lab binds its HTTP servers to 127.0.0.1:0 and
// prints no addresses.
func listening(t *testing.T, ss string, pid int) []string {
	t.Helper()
	out, err := exec.Command(ss, "-ltnpH").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	var addrs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 6 && strings.Contains(l, "pid="+strconv.Itoa(pid)+",") && strings.HasPrefix(f[3], "127.0.0.1:") {
			addrs = append(addrs, f[3])
		}
	}
	return addrs
}

// promQuery runs an instant query against the Prometheus at addr.
func promQuery(addr, q string) ([]any, error) {
	body, err := httpGet("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	var v struct {
		Status string `json:"status"`
		Data   struct {
			Result []any `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Status != "success" {
		return nil, fmt.Errorf("query %s: %v %s", q, err, tail(body, 300))
	}
	return v.Data.Result, nil
}

// TestLivePrometheus runs a real Prometheus (Debian's 2.42) scraping a
// short `isobar lab` run (two regions, the global pair) with
// deploy/prometheus/alerts.yml loaded: every rule must evaluate without
// error, and the series the alerts read must be present.
func TestLivePrometheus(t *testing.T) {
	suite(t)
	prom := need(t, "prometheus", "Debian prometheus")
	ss := need(t, "ss", "Debian iproute2")
	lab := start(t, "lab", nil, nil, isobarBin, "lab", "--duration", "150s", "--regions", "us-east,us-west", "--cells", "2",
		"--time-scale", "0.2", "--insecure")
	targets := map[string][]string{}
	poll(t, "lab's metrics endpoints", 60*time.Second, func() (bool, string) {
		clear(targets)
		for _, a := range listening(t, ss, lab.cmd.Process.Pid) {
			body, err := httpGet("http://" + a + "/metrics")
			if err != nil {
				continue
			}
			switch {
			case strings.Contains(body, "\nisobar_regional_"):
				targets["isobar-regional"] = append(targets["isobar-regional"], a)
			case strings.Contains(body, "\nisobar_global_"):
				targets["isobar-global"] = append(targets["isobar-global"], a)
			}
		}
		return len(targets["isobar-regional"]) >= 2 && len(targets["isobar-global"]) >= 2, fmt.Sprint(targets)
	})
	rules, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n", rules)
	for job, addrs := range targets {
		b, _ := json.Marshal(addrs)
		fmt.Fprintf(&cfg, "- job_name: %s\n  static_configs: [{targets: %s}]\n", job, b)
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	start(t, "prometheus", nil, nil, prom, "--config.file", cfgFile, "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr)
	waitDial(t, addr)

	type rule struct {
		Name           string `json:"name"`
		Health         string `json:"health"`
		LastError      string `json:"lastError"`
		State          string `json:"state"`
		LastEvaluation string `json:"lastEvaluation"`
	}
	var all []rule
	poll(t, "every rule evaluated", 60*time.Second, func() (bool, string) {
		body, err := httpGet("http://" + addr + "/api/v1/rules")
		if err != nil {
			return false, err.Error()
		}
		var v struct {
			Data struct {
				Groups []struct {
					Rules []rule `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return false, err.Error()
		}
		all = all[:0]
		for _, g := range v.Data.Groups {
			all = append(all, g.Rules...)
		}
		for _, r := range all {
			if r.Health == "unknown" || strings.HasPrefix(r.LastEvaluation, "0001") {
				return false, r.Name + " not evaluated yet"
			}
		}
		return len(all) > 0, fmt.Sprintf("%d rules", len(all))
	})
	firing := 0
	for _, r := range all {
		if r.Health != "ok" || r.LastError != "" {
			t.Errorf("rule %s: health %s, error %q", r.Name, r.Health, r.LastError)
		}
		if r.State == "firing" {
			firing++
			t.Logf("firing during the lab run: %s", r.Name)
		}
	}
	// The series the alerts read, from each role the lab runs.
	for _, q := range []string{
		`isobar_regional_cell_heartbeat_staleness_seconds`, `isobar_regional_cells{state="ready"}`,
		`isobar_regional_xds_pushes_total`, `isobar_regional_plan_epoch`, `isobar_regional_route_source`,
		`isobar_global_leader`, `isobar_global_plan_sequence`, `isobar_global_plan_epoch`, `isobar_global_regions`,
		`up{job="isobar-regional"} == 1`, `sum(isobar_global_leader) == 1`,
	} {
		var res []any
		poll(t, "series "+q, 60*time.Second, func() (bool, string) {
			var err error
			res, err = promQuery(addr, q)
			if err != nil {
				return false, err.Error()
			}
			return len(res) > 0, "no result"
		})
		t.Logf("PROM %s: %d series", q, len(res))
	}
	t.Logf("PROM %d rules evaluated without error, %d firing, targets %v", len(all), firing, targets)
}
