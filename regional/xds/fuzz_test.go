package xds

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/isobar-mesh/isobar/xdscontract"
)

// byteReader hands out fuzz bytes; past the end it returns zeros.
type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

func (r *byteReader) u32() uint32 {
	return uint32(r.next()) | uint32(r.next())<<8 | uint32(r.next())<<16 | uint32(r.next())<<24
}

// str returns a short string: mostly from a table of plausible values, with
// a raw-byte escape hatch for hostile ones.
func (r *byteReader) str(table []string) string {
	c := r.next()
	if int(c) < len(table) {
		return table[c]
	}
	if c < 200 {
		return table[int(c)%len(table)]
	}
	n := int(r.next() % 12)
	out := make([]byte, n)
	for i := range out {
		out[i] = r.next()
	}
	return string(out)
}

var (
	fuzzNames = []string{"m", "meta-llama/Llama-3.1-8B", "", "a b", "qwen", "x\x00y"}
	fuzzHosts = []string{"10.0.0.1", "10.0.0.2", "::1", "::ffff:10.0.0.1", "fe80::1%eth0", "host.local", "", "2001:db8::2"}
	fuzzCells = []string{"c1", "c2", "c3", "", "cell with space"}
	fuzzZones = []string{"", "us-east", "eu-west", "z\n"}
	fuzzSheds = []float64{0, 0.25, 1, 1e-7, -1, math.NaN(), 1.5}
)

// stateFromBytes decodes a small State: up to 3 models, 3 localities each,
// 4 endpoints each.
func stateFromBytes(b []byte) State {
	r := &byteReader{b: b}
	var st State
	for range r.next() % 4 {
		m := Model{Name: r.str(fuzzNames)}
		if c := r.next(); c >= 0xf0 {
			m.Shed = fuzzSheds[int(c)%len(fuzzSheds)]
		}
		for range r.next() % 4 {
			l := Locality{Region: r.str(fuzzZones), Zone: r.str(fuzzZones), Weight: r.u32() % 5, Priority: uint32(r.next() % 3)}
			if r.next()%8 == 0 {
				l.Weight = r.u32()
			}
			for range r.next() % 5 {
				e := Endpoint{CellID: r.str(fuzzCells), Host: r.str(fuzzHosts), Port: r.u32() % 70000, Weight: r.u32() % 4, MaxModelLen: r.u32()}
				if r.next()%8 == 0 {
					e.Weight = r.u32()
				}
				l.Endpoints = append(l.Endpoints, e)
			}
			m.Localities = append(m.Localities, l)
		}
		pinnedFromBytes(r, &m)
		st.Models = append(st.Models, m)
	}
	return st
}

var fuzzSets = []string{"eu", "us", "eu+us", "", "a b"}

// pinnedFromBytes adds per-criticality shares, a retry budget and up to 3
// residency sets to m, each pinned to some of m's localities.
func pinnedFromBytes(r *byteReader, m *Model) {
	c := r.next()
	if c < 0xc0 {
		return
	}
	m.ShedCritical = fuzzSheds[int(r.next())%len(fuzzSheds)]
	m.ShedSheddable = fuzzSheds[int(r.next())%len(fuzzSheds)]
	m.RetryBudgetPercent = []float64{0, 0.4, 7.5, 100, -1, math.NaN(), 101}[r.next()%7]
	for range c % 4 {
		p := Pinned{Set: r.str(fuzzSets), Shed: fuzzSheds[int(r.next())%len(fuzzSheds)]}
		for range r.next() % 3 {
			p.Regions = append(p.Regions, r.str(fuzzZones))
		}
		mask := r.next()
		for i, l := range m.Localities {
			if mask&(1<<i) != 0 {
				p.Localities = append(p.Localities, l)
			}
		}
		m.Pinned = append(m.Pinned, p)
	}
}

// FuzzBuild checks that any State is either refused as ErrInvalidState or
// yields resources that pass every validation: the input checks must catch
// everything ValidateAll, Consistent and the reference check would.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 0, 2, 1, 1, 2, 3, 0, 0, 0, 1, 0, 3, 0, 1, 1, 0x40, 0x1f, 0, 0, 2, 0, 0, 0})
	f.Add([]byte("\x03\x01\x03\x02\x02\x02\x02\x00\x00\x00\x02\x04\x02\x01\x50\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte{1, 0xff, 5, 'm', '\x7f', 'x', 'y', 'z', 1, 0, 0, 0, 0, 0, 0, 0, 1})
	// One model, one local locality with one endpoint, two residency sets.
	f.Add([]byte{1, 0, 0, 1, 0, 2, 1, 0, 0, 0, 0, 1, 3, 0, 1, 0x40, 0x1f, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
		0xc2, 1, 2, 2, 0, 0, 1, 2, 1, 1, 1, 2, 0})
	cfgs := []Config{testConfig(), {Region: "r", LBPolicy: xdscontract.RingHash}, {Region: "r", LBPolicy: xdscontract.RoundRobin},
		{Region: "eu-west", ContextClasses: []uint32{1, 8192}}}
	builders := make([]*Builder, len(cfgs))
	for i, c := range cfgs {
		b, err := NewBuilder(c)
		if err != nil {
			f.Fatal(err)
		}
		builders[i] = b
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := stateFromBytes(data)
		b := builders[len(data)%len(builders)]
		res, err := b.Build(st)
		if err != nil {
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("Build refused %+v with %v; want ErrInvalidState (input checks missed something)", st, err)
			}
			return
		}
		checkSet(t, KindEnvoy, &res.Envoy)
		checkSet(t, KindGRPC, &res.GRPC)
		for _, cla := range res.Envoy.Endpoints {
			seen := make(map[string]bool)
			for _, l := range cla.GetEndpoints() {
				if l.GetLoadBalancingWeight().GetValue() == 0 {
					t.Fatalf("locality weight 0 accepted in %s", cla.GetClusterName())
				}
				for _, e := range l.GetLbEndpoints() {
					a := e.GetEndpoint().GetAddress().GetSocketAddress()
					k := fmt.Sprintf("%s:%d", a.GetAddress(), a.GetPortValue())
					if seen[k] || e.GetLoadBalancingWeight().GetValue() == 0 {
						t.Fatalf("duplicate address or zero weight accepted: %s in %s", k, cla.GetClusterName())
					}
					seen[k] = true
				}
			}
		}
	})
}

// FuzzStreamRequests feeds arbitrary request sequences (what clients send:
// type URLs, nonces, versions, error details, nodes) through the callbacks.
// They must never panic, keep metric labels bounded and keep ACK state
// consistent with what was sent.
func FuzzStreamRequests(f *testing.F) {
	f.Add([]byte{0, 1, 3, 1, 2, 3, 1, 2, 3, 0})
	f.Add([]byte{0, 1, 0, 2, 0, 0, 2, 0, 1, 2, 4, 1, 1})
	f.Add([]byte{0, 0, 2, 1, 9, 9, 3, 3, 3, 1, 1, 1, 1})
	// open, send version 1, Stop, then the ACK arrives.
	f.Add([]byte{0, 3, 0, 0, 3, 2, 1, 1, 0, 3, 4, 0, 3, 3, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := NewServer(Config{Region: "r"}, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		if _, err := s.Push(State{Models: []Model{fleet("m", 2)}}); err != nil {
			t.Fatal(err)
		}
		cb := callbacks{s}
		types := []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType, "", "type.googleapis.com/x", "\xff"}
		words := []string{"", "1", "2", "0", "abc", "18446744073709551616", "-1"}
		uas := []string{"envoy", "gRPC Go", "", "gRPC "}
		sent := map[string]bool{"": true}
		r := &byteReader{b: data}
		for op := 0; r.i < len(data) && op < 64; op++ {
			id := int64(r.next() % 3)
			typ := types[int(r.next())%len(types)]
			switch r.next() % 5 {
			case 4:
				s.Stop() // streams may still report after Stop
			case 0:
				_ = cb.OnStreamOpen(context.Background(), id, typ)
			case 1:
				cb.OnStreamClosed(id, nil)
			case 2:
				v := words[int(r.next())%len(words)]
				sent[v] = true
				cb.OnStreamResponse(context.Background(), id, nil, &discovery.DiscoveryResponse{
					TypeUrl: typ, VersionInfo: v, Nonce: words[int(r.next())%len(words)]})
			default:
				req := &discovery.DiscoveryRequest{
					TypeUrl:       typ,
					VersionInfo:   words[int(r.next())%len(words)],
					ResponseNonce: words[int(r.next())%len(words)],
				}
				if r.next()%2 == 0 {
					req.Node = &core.Node{Id: words[int(r.next())%len(words)], UserAgentName: uas[int(r.next())%len(uas)]}
				}
				if r.next()%3 == 0 {
					req.ErrorDetail = &statuspb.Status{Message: string(data)}
				}
				_ = cb.OnStreamRequest(id, req)
			}
		}
		for _, st := range s.Streams() {
			for typ, ts := range st.Types {
				if typeIndex(typ) < 0 {
					t.Fatalf("untracked type %q in stream status", typ)
				}
				if len(ts.NackDetail) > maxDetailLen {
					t.Fatalf("NACK detail of %d bytes kept", len(ts.NackDetail))
				}
				if !sent[ts.Acked] || !sent[ts.Nacked] || !sent[ts.Sent] {
					t.Fatalf("stream %d %s: acked %q nacked %q sent %q, not all versions this server sent", st.ID, typ, ts.Acked, ts.Nacked, ts.Sent)
				}
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.WaitForAck(ctx, resource.EndpointType, "1"); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopped) {
			t.Fatalf("WaitForAck: %v", err)
		}
		labels := map[string]bool{"listener": true, "route": true, "cluster": true, "endpoint": true, "lb_endpoint": true, "other": true}
		ch := make(chan prometheus.Metric, 64)
		s.m.requests.Collect(ch)
		s.m.responses.Collect(ch)
		close(ch)
		for m := range ch {
			var d dto.Metric
			if err := m.Write(&d); err != nil {
				t.Fatal(err)
			}
			for _, lp := range d.GetLabel() {
				if !labels[lp.GetValue()] {
					t.Fatalf("unbounded metric label %q", lp.GetValue())
				}
			}
		}
	})
}
