package gossip

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/protobuf/proto"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
	summarybounds "github.com/isobar-mesh/isobar/summary"
)

// The node's Vivaldi network coordinate, computed the way serf computes
// its members' (hashicorp/serf serf/ping_delegate.go): every probe ack
// carries the responder's coordinate (AckPayload), and the prober feeds
// it with the probe's RTT to its coordinate.Client (NotifyPingComplete).
// memberlist v0.7.0 measures the RTTs but keeps no coordinate; serf's
// coordinate package is the well-kept implementation used here. Unlike
// serf, the payload is the wire protocol's NetworkCoordinate, and only
// the probes of verified regional members of other regions count (the
// same members whose RTTs count, book.pingRTT), so a member that cannot
// prove a region cannot pull this node's coordinate.
//
// The coordinate goes into the region's summary (summary.Input.Coordinate),
// from which the global and the fallback estimate the RTT between regions
// that did not list each other (summary.RTTMatrix).

const (
	// coordPayloadVersion is the first byte of an ack payload.
	coordPayloadVersion = 1
	// maxCoordPayload bounds an ack payload before it is decoded: a
	// coordinate of summary.MaxCoordinateDims dimensions is about 170
	// bytes.
	maxCoordPayload = 512
)

// Coordinate refusal reasons (isobar_gossip_coordinates_refused_total).
const (
	coordRefusedUndecodable = "undecodable"
	coordRefusedInvalid     = "invalid"
	coordRefusedRejected    = "rejected"
)

var coordRefusalReasons = []string{coordRefusedUndecodable, coordRefusedInvalid, coordRefusedRejected}

// errCoordPayload is wrapped by decodeCoordinate's refusals of a payload
// that is not a coordinate; test with errors.Is.
var errCoordPayload = errors.New("gossip: bad coordinate payload")

// encodeCoordinate is the ack payload carrying c: a version byte, then
// the NetworkCoordinate.
func encodeCoordinate(c *coordinate.Coordinate) []byte {
	b, err := proto.Marshal(&isobarpb.NetworkCoordinate{Vec: c.Vec, Error: c.Error, Adjustment: c.Adjustment, Height: c.Height})
	if err != nil {
		return nil // unreachable: a message of doubles always encodes
	}
	return append([]byte{coordPayloadVersion}, b...)
}

// decodeCoordinate parses an ack payload. It refuses an oversized or
// undecodable payload or an unknown version (wrapping errCoordPayload),
// and a coordinate outside summarybounds.ValidateCoordinate's bounds (wrapping
// summarybounds.ErrInvalid).
func decodeCoordinate(b []byte) (*coordinate.Coordinate, error) {
	switch {
	case len(b) == 0:
		return nil, fmt.Errorf("%w: empty", errCoordPayload)
	case len(b) > maxCoordPayload:
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errCoordPayload, len(b), maxCoordPayload)
	case b[0] != coordPayloadVersion:
		return nil, fmt.Errorf("%w: version %d, want %d", errCoordPayload, b[0], coordPayloadVersion)
	}
	var pb isobarpb.NetworkCoordinate
	if err := proto.Unmarshal(b[1:], &pb); err != nil {
		return nil, fmt.Errorf("%w: %v", errCoordPayload, err)
	}
	if err := summarybounds.ValidateCoordinate(&pb); err != nil {
		return nil, err
	}
	return summarybounds.Coordinate(&pb), nil
}

// newVivaldi is this node's coordinate client with serf's defaults (8
// dimensions).
func newVivaldi() *coordinate.Client {
	c, err := coordinate.NewClient(coordinate.DefaultConfig())
	if err != nil {
		panic(fmt.Sprintf("gossip: serf's default coordinate config refused: %v", err)) // unreachable
	}
	return c
}

// observeCoordinate folds one probe of member name (its RTT and the
// coordinate its ack carried) into this node's coordinate, counting a
// refused payload or update.
func (n *Node) observeCoordinate(name string, rtt time.Duration, payload []byte) {
	other, err := decodeCoordinate(payload)
	switch {
	case errors.Is(err, errCoordPayload):
		n.m.coordRefused.WithLabelValues(coordRefusedUndecodable).Inc()
		n.log.Debug("gossip coordinate refused", "member", name, "err", err)
		return
	case err != nil:
		n.m.coordRefused.WithLabelValues(coordRefusedInvalid).Inc()
		n.log.Debug("gossip coordinate refused", "member", name, "err", err)
		return
	}
	// Update refuses an incompatible dimensionality, a non-finite result
	// and RTTs outside (0, 10 s].
	if _, err := n.vivaldi.Update(name, other, rtt); err != nil {
		n.m.coordRefused.WithLabelValues(coordRefusedRejected).Inc()
		n.log.Debug("gossip coordinate update refused", "member", name, "err", err)
		return
	}
	n.coordSamples.Add(1)
}

// minCoordSamples is how many probes must have moved the coordinate before
// Coordinate reports it. A node starts at the origin, which would put it
// next to every region; serf's error estimate cannot tell (it stays at its
// maximum, 1.5, wherever the RTTs are tiny or noisy, as on loopback).
const minCoordSamples = 3

// Coordinate returns this node's current network coordinate (a copy), or
// nil before minCoordSamples probes have placed it.
func (n *Node) Coordinate() *coordinate.Coordinate {
	if n.coordSamples.Load() < minCoordSamples {
		return nil
	}
	return n.vivaldi.GetCoordinate()
}
