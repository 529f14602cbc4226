package gossip

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	summarybounds "github.com/isobar-mesh/isobar/summary"
)

func coordPayload(t testing.TB, c *isobarpb.NetworkCoordinate) []byte {
	t.Helper()
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{coordPayloadVersion}, b...)
}

// A probe ack's coordinate round-trips, and every malformed one is
// refused with the class of error its counter reason follows.
func TestDecodeCoordinate(t *testing.T) {
	good := &coordinate.Coordinate{Vec: []float64{0.01, -0.02, 0, 0, 0, 0, 0, 0.003}, Error: 0.4, Adjustment: -0.001, Height: 0.0002}
	got, err := decodeCoordinate(encodeCoordinate(good))
	if err != nil || !slices.Equal(got.Vec, good.Vec) || got.Error != good.Error || got.Adjustment != good.Adjustment || got.Height != good.Height {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	vec := func(v ...float64) *isobarpb.NetworkCoordinate {
		return &isobarpb.NetworkCoordinate{Vec: v, Error: 0.5, Height: 1e-5}
	}
	cases := map[string]struct {
		payload []byte
		want    error
	}{
		"empty":           {nil, errCoordPayload},
		"wrong version":   {append([]byte{9}, coordPayload(t, vec(1))[1:]...), errCoordPayload},
		"garbage":         {[]byte{coordPayloadVersion, 0xff, 0xff, 0xff}, errCoordPayload},
		"oversized":       {make([]byte, maxCoordPayload+1), errCoordPayload},
		"no dimensions":   {coordPayload(t, vec()), summarybounds.ErrInvalid},
		"17 dimensions":   {coordPayload(t, vec(make([]float64, 17)...)), summarybounds.ErrInvalid},
		"NaN component":   {coordPayload(t, vec(0, math.NaN())), summarybounds.ErrInvalid},
		"absurd":          {coordPayload(t, vec(1e9)), summarybounds.ErrInvalid},
		"negative error":  {coordPayload(t, &isobarpb.NetworkCoordinate{Vec: []float64{0}, Error: -1}), summarybounds.ErrInvalid},
		"negative height": {coordPayload(t, &isobarpb.NetworkCoordinate{Vec: []float64{0}, Height: -1}), summarybounds.ErrInvalid},
		"Inf adjustment":  {coordPayload(t, &isobarpb.NetworkCoordinate{Vec: []float64{0}, Adjustment: math.Inf(-1)}), summarybounds.ErrInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeCoordinate(tc.payload); !errors.Is(err, tc.want) {
				t.Fatalf("decodeCoordinate = %v, want %v", err, tc.want)
			}
		})
	}
}

// observeCoordinate moves the node's coordinate on a good ack and counts
// each bad one by reason, leaving the coordinate as it was.
func TestObserveCoordinate(t *testing.T) {
	n := &Node{m: nilMetrics(t), vivaldi: newVivaldi(), log: testLogger(t)}
	start := n.vivaldi.GetCoordinate()
	peer := &coordinate.Coordinate{Vec: []float64{0.02, 0, 0, 0, 0, 0, 0, 0}, Error: 0.2, Height: 1e-5}
	for k := range minCoordSamples {
		if c := n.Coordinate(); c != nil {
			t.Fatalf("coordinate reported after %d probes: %+v", k, c)
		}
		n.observeCoordinate("regional/x", 40*time.Millisecond, encodeCoordinate(peer))
	}
	moved := n.Coordinate()
	if moved == nil || moved.Error >= start.Error || slices.Equal(moved.Vec, start.Vec) {
		t.Fatalf("probes did not place the coordinate: %+v → %+v", start, moved)
	}
	bad := map[string][]byte{
		coordRefusedUndecodable: {coordPayloadVersion, 0xff},
		coordRefusedInvalid:     coordPayload(t, &isobarpb.NetworkCoordinate{Vec: []float64{math.NaN()}}),
		// Update refuses another dimensionality.
		coordRefusedRejected: encodeCoordinate(&coordinate.Coordinate{Vec: []float64{0.01, 0}, Error: 0.2}),
	}
	for reason, payload := range bad {
		n.observeCoordinate("regional/x", 40*time.Millisecond, payload)
		if got := testutil.ToFloat64(n.m.coordRefused.WithLabelValues(reason)); got != 1 {
			t.Errorf("refused{%s} = %v, want 1", reason, got)
		}
	}
	if after := n.Coordinate(); !slices.Equal(after.Vec, moved.Vec) || after.Error != moved.Error {
		t.Errorf("bad acks moved the coordinate: %+v → %+v", moved, after)
	}
}

// FuzzDecodeCoordinate feeds arbitrary probe-ack payloads to the decoder:
// it never panics, and whatever it accepts is a coordinate the summary
// accepts and serf's client can use without a panic.
func FuzzDecodeCoordinate(f *testing.F) {
	f.Add(encodeCoordinate(&coordinate.Coordinate{Vec: make([]float64, 8), Error: 1.5, Height: 1e-5}))
	f.Add(encodeCoordinate(&coordinate.Coordinate{Vec: []float64{0.01, 0.02}, Error: 0.3}))
	f.Add([]byte{coordPayloadVersion})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCoordinate(b)
		if err != nil {
			return
		}
		if err := summarybounds.ValidateCoordinate(summarybounds.CoordinateProto(c)); err != nil {
			t.Fatalf("accepted %+v that the summary refuses: %v", c, err)
		}
		v := newVivaldi()
		if c.IsCompatibleWith(v.GetCoordinate()) {
			_, _ = v.Update("x", c, 30*time.Millisecond)
		}
	})
}
