package interop

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBadADSInput: while grpc-js-xds is served by a real regional
// controller, a raw Node ADS client NACKs the Cluster twice, answers twice
// with a nonce it was never sent, and subscribes to a Cluster that does
// not exist. The controller counts each (isobar_regional_xds_nacks_total,
// _stale_nonces_total, _unknown_resource_requests_total), logs each kind
// once for that version, keeps running, and the other subscriber still
// follows updates (a drained cell stops receiving its RPCs).
func TestBadADSInput(t *testing.T) {
	suite(t)
	var js []judge
	for _, j := range judges(t) {
		if j.name == "grpc-js-xds" {
			js = append(js, j)
		}
	}
	if len(js) == 0 {
		t.Skip("INTEROP-SKIP: the Node judge is not installed")
	}
	node := js[0].argv[0]
	f := startFleet(t, "least_request", 2)
	c := startClient(t, js[0], f.ctrl)
	c.split(t, []string{"b0", "b1"}, 100)
	metric := func(name, typ string) float64 { return f.counter(t, name)[`type="`+typ+`"`] }
	nacks0 := metric("isobar_regional_xds_nacks_total", "cluster")
	stale0 := metric("isobar_regional_xds_stale_nonces_total", "cluster")
	unknown0 := metric("isobar_regional_xds_unknown_resource_requests_total", "cluster")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	raw := exec.CommandContext(ctx, node, "rawads.js", f.ctrl, model)
	raw.Stdout, raw.Stderr = &out, &out
	if err := raw.Run(); err != nil || !strings.Contains(out.String(), `"done":true`) {
		t.Fatalf("rawads.js: %v\n%s", err, out.String())
	}
	t.Logf("rawads.js:\n%s", out.String())
	poll(t, "bad input counted", 30*time.Second, func() (bool, string) {
		n, s, u := metric("isobar_regional_xds_nacks_total", "cluster")-nacks0,
			metric("isobar_regional_xds_stale_nonces_total", "cluster")-stale0,
			metric("isobar_regional_xds_unknown_resource_requests_total", "cluster")-unknown0
		return n == 2 && s == 2 && u >= 1, strings.Join([]string{"nacks", ftoa(n), "stale", ftoa(s), "unknown", ftoa(u)}, " ")
	})
	logs := f.regional.out.String()
	for _, msg := range []string{"xds client rejected resources", "xds request with a stale or unknown nonce ignored",
		"xds request names resources this server does not have"} {
		n := 0
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, msg) && strings.Contains(l, "node_id=interop-raw") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%q logged %d times for the raw client, want once:\n%s", msg, n, grepLines(logs, "interop-raw"))
		}
	}
	t.Logf("BADINPUT regional log:\n%s", grepLines(logs, "interop-raw"))

	select {
	case <-f.regional.done:
		t.Fatal("the regional controller exited")
	default:
	}
	drained := time.Now()
	f.drain(t, "cell-0")
	d := c.stopsReceiving(t, "b0", drained, 200)
	t.Logf("FIGURE bad-input: the other subscriber (grpc-js-xds) still follows updates: drained cell-0 left its RPCs %v after the drain call", d)
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
