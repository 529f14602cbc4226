package statusview

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/isobar-mesh/isobar/debugapi"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

func TestControllerTable(t *testing.T) {
	srv := controllerServer(t)
	rep, got := collect(t, []string{srv.URL}, nil)
	t.Log("\n" + got)
	if n := rep.Failed(); n != 0 {
		t.Fatalf("%d sources failed: %+v", n, rep)
	}
	if want := "== controller " + srv.URL + ": 3 cells (1 Draining, 1 Failed, 1 Ready), cycle 4242, at 2026-03-01T12:00:00Z\n"; !strings.HasPrefix(got, want) {
		t.Errorf("header: want %q", want)
	}
	rows := tableRows(t, got, "CELL")
	want := [][]string{
		{"CELL", "STATE", "PRESSURE", "WEIGHT", "TARGET", "PENALTY", "FALLBACK", "HEARTBEAT", "ENDPOINT", "MODEL/MAX_LEN", "REASON"},
		{"east-0", "Ready", "0.412", "37", "40", "-", "no", "1.5s", "127.0.0.1:8001", "llama-70b/8192", "engine ready"},
		{"east-1", "Failed", "0.000", "0", "0", "-", "yes", "21s", "127.0.0.1:8002", "llama-70b/4096", "no heartbeat for 1s"},
		{"east-2", "Draining+drain", "0.900", "5", "12", "0.25 probation", "no", "0.2s", "127.0.0.1:8003", "llama-70b/8192", `operator\tdrain\x1b[2J`},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d table rows, want %d: %q", len(rows), len(want), rows)
	}
	for i := range want {
		if strings.Join(rows[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("row %d:\n got %q\nwant %q", i, rows[i], want[i])
		}
	}
	if !strings.Contains(got, "routes: plan, epoch 7, sequence 12, leader global-a, valid 28s more\n") {
		t.Error("routes line missing or wrong")
	}
	routes := tableRows(t, got, "MODEL")
	wantRoutes := [][]string{
		{"MODEL", "ROUTES", "SHED"},
		{"llama-70b", "east 0.7000, west 0.2500 (127.0.0.1:7100)", "0.0500"},
		{"mistral", "east 1.0000", "0.0000"},
	}
	if len(routes) != len(wantRoutes) {
		t.Fatalf("routes table %q", routes)
	}
	for i := range wantRoutes {
		if strings.Join(routes[i], "|") != strings.Join(wantRoutes[i], "|") {
			t.Errorf("routes row %d:\n got %q\nwant %q", i, routes[i], wantRoutes[i])
		}
	}
	if strings.ContainsRune(got, '\x1b') {
		t.Error("a control character from the controller reached the terminal")
	}
}

func TestRoutesSummary(t *testing.T) {
	rt := statusRoutesFixture()
	for _, tc := range []struct {
		name string
		t    debugapi.RouteTable
		at   *time.Time
		want string
	}{
		{"plan", rt, &statusAt, "plan, epoch 7, sequence 12, leader global-a, valid 28s more"},
		{"expired", rt, new(statusAt.Add(90 * time.Second)), "plan, epoch 7, sequence 12, leader global-a, expired 1m02s ago"},
		{"no clock", rt, nil, "plan, epoch 7, sequence 12, leader global-a, valid until 2026-03-01T12:00:28Z"},
		{"local", debugapi.RouteTable{Source: debugapi.RoutesLocal}, &statusAt, "local"},
		{"fallback", debugapi.RouteTable{Source: debugapi.RoutesFallback}, &statusAt, "fallback"},
		{"hostile leader", debugapi.RouteTable{Source: "plan", Epoch: 1, LeaderID: "x\x1b[2J"}, nil, `plan, epoch 1, sequence 0, leader x\x1b[2J`},
	} {
		if got := RoutesSummary(tc.t, tc.at); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestShares(t *testing.T) {
	for _, tc := range []struct {
		routes  map[string]float64
		ingress map[string]string
		want    string
	}{
		{nil, nil, "-"},
		{map[string]float64{"c": 0.2, "b": 0.8}, nil, "b 0.8000, c 0.2000"},
		{map[string]float64{"b": 0.5, "a": 0.5}, nil, "a 0.5000, b 0.5000"},
		{map[string]float64{"a": 0.25, "b": 0.75}, map[string]string{"b": "10.0.0.1:80"}, "b 0.7500 (10.0.0.1:80), a 0.2500"},
	} {
		if got := Shares(tc.routes, tc.ingress); got != tc.want {
			t.Errorf("Shares(%v, %v) = %q, want %q", tc.routes, tc.ingress, got, tc.want)
		}
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                  "0s",
		400 * time.Millisecond:        "0.4s",
		12 * time.Second:              "12s",
		3*time.Minute + 5*time.Second: "3m05s",
		50 * time.Hour:                "2d",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"":                      "-",
		"east-0":                "east-0",
		"a\tb":                  `a\tb`,
		"\x1b[31mred":           `\x1b[31mred`,
		"bad\xff":               `bad\xff`,
		strings.Repeat("x", 70): strings.Repeat("x", 63) + "…",
		"ünïcode":               "ünïcode",
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

// A plan that does not parse is reported in its member's section, not
// dropped and not an error of the whole table.
func TestGlobalUnreadablePlan(t *testing.T) {
	var w bytes.Buffer
	if err := WriteTable(&w, Report{Globals: []Global{{Global: "g", Plan: json.RawMessage(`{"epoch": "x"}`)}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.String(), "error: plan: not a routing plan: ") {
		t.Errorf("output:\n%s", w.String())
	}
}

// FuzzAnswers feeds arbitrary controller and global answers through the
// decoding and the table: it must never panic, and no control character
// from the input may reach the terminal.
func FuzzAnswers(f *testing.F) {
	cells, _ := json.Marshal(statusCellsFixture())
	routes, _ := json.Marshal(statusRoutesFixture())
	plan, _ := protojson.Marshal(statusPlanFixture())
	f.Add(cells, routes, plan)
	f.Add([]byte(`{"at":"2026-01-01T00:00:00Z","cells":[{"id":"\u001b[2J","last_seen":"0001-01-01T00:00:00Z"}]}`),
		[]byte(`{"source":"local","note":"x"}`), []byte(`{}`))
	f.Add([]byte(`{"cells":null}`), []byte(`{"Source":"plan","ValidUntil":"1970-01-01T00:00:00Z","Models":{"m":{"Routes":{"a\n":1e308}}}}`),
		[]byte(`{"plans":[{"routes":[{"fraction":"NaN"}]}]}`))
	f.Add([]byte(`[]`), []byte(`null`), []byte(`{"issuedAt":"9999-12-31T23:59:59Z","validUntil":"0001-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, cellsBody, routesBody, planBody []byte) {
		var w bytes.Buffer
		c := Controller{Controller: "x"}
		var cd cellsAnswer
		if json.Unmarshal(cellsBody, &cd) == nil {
			at := cd.At
			c.At, c.Cells = &at, cd.Cells
		}
		var rt debugapi.RouteTable
		if json.Unmarshal(routesBody, &rt) == nil {
			c.Routes = &rt
		}
		g := Global{Global: "g"}
		if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(planBody, &isobarpb.RoutingPlan{}) == nil {
			g.Plan = planBody
		}
		if err := WriteTable(&w, Report{Controllers: []Controller{c}, Globals: []Global{g}}); err != nil {
			t.Fatal(err)
		}
		for _, r := range w.String() {
			if r != '\n' && r < 0x20 || r == 0x7f {
				t.Fatalf("control character %q in the table:\n%s", r, w.String())
			}
		}
	})
}
