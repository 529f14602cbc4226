package wan

import (
	"bytes"
	"log"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// mlLog collects memberlist's log lines and signals the first containing
// want. It never calls t.Log: memberlist may still log from its own
// goroutines after the test returns.
type mlLog struct {
	want string
	seen chan struct{}
	once sync.Once
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (l *mlLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(b)
	l.mu.Unlock()
	if l.want != "" && strings.Contains(string(b), l.want) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(b), nil
}

func (l *mlLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// rttLog is a memberlist PingDelegate recording probe RTTs per peer.
type rttLog struct {
	mu    sync.Mutex
	rtts  map[string][]time.Duration
	want  int
	ready chan struct{}
	once  sync.Once
}

func newRTTLog(want int) *rttLog {
	return &rttLog{rtts: map[string][]time.Duration{}, want: want, ready: make(chan struct{})}
}

func (r *rttLog) AckPayload() []byte { return nil }

func (r *rttLog) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, _ []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rtts[other.Name] = append(r.rtts[other.Name], rtt)
	if len(r.rtts[other.Name]) >= r.want {
		r.once.Do(func() { close(r.ready) })
	}
}

func (r *rttLog) of(name string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rtts[name])
}

// mlNode is one memberlist node whose traffic to its peer goes through a
// WAN path.
type mlNode struct {
	name string
	nt   *memberlist.NetTransport
	addr string
	rtt  *rttLog
	log  *mlLog
	ml   *memberlist.Memberlist
}

func newMLNode(t *testing.T, name string, logWant string) *mlNode {
	t.Helper()
	n := &mlNode{name: name, rtt: newRTTLog(5), log: &mlLog{want: logWant, seen: make(chan struct{})}}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, Logger: log.New(n.log, name+" ", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.nt = nt
	n.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort()))
	return n
}

// start creates the memberlist with traffic to peerAddr routed to via.
func (n *mlNode) start(t *testing.T, peerAddr, via string) {
	t.Helper()
	cfg := memberlist.DefaultLocalConfig()
	cfg.Name = n.name
	cfg.Transport = &Transport{NodeAwareTransport: n.nt, Route: func(addr string) string {
		if addr == peerAddr {
			return via
		}
		return addr
	}}
	cfg.AdvertiseAddr = "127.0.0.1"
	cfg.AdvertisePort = n.nt.GetAutoBindPort()
	// The probe timing of regional/gossip's local profile.
	cfg.ProbeInterval = 250 * time.Millisecond
	cfg.ProbeTimeout = 150 * time.Millisecond
	cfg.GossipInterval = 50 * time.Millisecond
	cfg.Ping = n.rtt
	cfg.Logger = log.New(n.log, n.name+" ", 0)
	ml, err := memberlist.Create(cfg)
	if err != nil {
		_ = n.nt.Shutdown()
		t.Fatal(err)
	}
	n.ml = ml
	t.Cleanup(func() { _ = ml.Shutdown() })
}

// waitMemberlistGone waits until no memberlist goroutine is left:
// Shutdown does not join a probe still waiting for its ack timer (up to a
// probe interval, scaled by memberlist's awareness).
func waitMemberlistGone(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	eventually(t, "memberlist goroutines to exit", func() bool {
		n := runtime.Stack(buf, true)
		return !bytes.Contains(buf[:n], []byte("hashicorp/memberlist."))
	})
}

// TestMemberlistRTTNeedsUDPPath measures what memberlist's probes report
// across WAN paths a→b and b→a, with regional/gossip's local probe timing
// (probe every 250 ms, UDP ack timeout 150 ms):
//   - a TCP and a UDP proxy per path on one port: the probe RTT is
//     delay(a→b) + delay(b→a) plus 1-5 ms (more on a loaded machine);
//   - TCP proxies only: the members stay alive through memberlist's TCP
//     fallback ping but report no RTT at all (this is why the lab needs
//     UDPProxy);
//   - a round trip above the 150 ms ack timeout (but below the probe
//     interval): memberlist counts the late ack, so the peer stays alive,
//     but reports no RTT;
//   - a round trip above the probe interval: the peer is suspected.
//
// So emulated inter-region round trips must stay below the gossip
// ProbeTimeout to be measured.
func TestMemberlistRTTNeedsUDPPath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		udp    bool
		ab, ba time.Duration
		want   string // rtt, or the log line of a to wait for
		alive  bool   // b must still be alive then
	}{
		{"tcp and udp paths", true, 15 * time.Millisecond, 25 * time.Millisecond, "rtt", true},
		// Short delays leave the TCP fallback (100 ms after the UDP
		// timeout) ample margin on a busy machine.
		{"tcp paths only", false, 2 * time.Millisecond, 2 * time.Millisecond, "over TCP but UDP probes failed", true},
		{"round trip above probe timeout", true, 80 * time.Millisecond, 80 * time.Millisecond, "Failed UDP ping: b (timeout reached)", true},
		{"round trip above probe interval", true, 150 * time.Millisecond, 150 * time.Millisecond, "Suspect b has failed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { waitMemberlistGone(t) }) // runs last
			logWant := tc.want
			if logWant == "rtt" {
				logWant = ""
			}
			a := newMLNode(t, "a", logWant)
			b := newMLNode(t, "b", "")
			// path builds the proxies of one direction, to the far node.
			path := func(name string, delay time.Duration, to *mlNode) string {
				cfg := Config{Path: name, Target: to.addr, Delay: delay}
				if !tc.udp {
					return newProxy(t, cfg, Deps{}).Addr()
				}
				p, err := NewPath(cfg, Deps{Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(p.Stop)
				if err := p.Start(); err != nil {
					t.Fatal(err)
				}
				return p.Addr()
			}
			a.start(t, b.addr, path("a-b", tc.ab, b))
			b.start(t, a.addr, path("b-a", tc.ba, a))
			if _, err := a.ml.Join([]string{b.addr}); err != nil {
				t.Fatalf("join through the a-b path: %v\n%s", err, a.log)
			}
			limit := time.NewTimer(waitLimit)
			defer limit.Stop()
			if tc.want == "rtt" {
				select {
				case <-a.rtt.ready:
				case <-limit.C:
					t.Fatalf("a got no 5 probe RTTs of b\n%s", a.log)
				}
				rtts := a.rtt.of("b")
				slices.Sort(rtts)
				t.Logf("a's probe RTTs of b: %v (a→b %v + b→a %v)", rtts, tc.ab, tc.ba)
				// The fastest probe: the others may carry scheduling
				// delays of a loaded machine (memberlist runs on real time).
				if rtts[0] < tc.ab+tc.ba || rtts[0] > tc.ab+tc.ba+10*time.Millisecond {
					t.Errorf("fastest probe RTT %v; want %v + at most 10ms", rtts[0], tc.ab+tc.ba)
				}
				return
			}
			select {
			case <-a.log.seen:
			case <-limit.C:
				t.Fatalf("a never logged %q\n%s", tc.want, a.log)
			}
			if got := a.rtt.of("b"); len(got) != 0 {
				t.Errorf("a reported probe RTTs %v of b", got)
			}
			alive := 0
			for _, m := range a.ml.Members() {
				if m.State == memberlist.StateAlive {
					alive++
				}
			}
			t.Logf("%s: a logged %q, %d alive members, no probe RTT", tc.name, tc.want, alive)
			if tc.alive && alive != 2 {
				t.Errorf("%d alive members, want 2: the TCP fallback or the late ack keeps b alive", alive)
			}
		})
	}
}
