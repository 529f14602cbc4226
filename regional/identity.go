package regional

import (
	"context"
	"fmt"

	"github.com/isobar-mesh/isobar/certs"
	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// Authorisation by certificate identity. With mTLS (Config.TLS) every
// client of the controller's gRPC port is known by the isobar identity in
// its verified certificate's URI SAN, never by a common name or DNS SAN:
//
//   - CellRegistry.Heartbeat: a cell of this region, heartbeating only
//     for its own cell id and region (peerCell, identityMatches), and
//     advertising only an endpoint its certificate allows: an IP SAN by
//     default, a prefix of --endpoint-map-file with mapping, anything with
//     off (endpointbind.go);
//   - xDS (ADS and the per-type services) and DataPlane.Report: a gateway
//     of this region, spiffe://isobar/gateway/<region> (gatewayPeer);
//   - the global leader a region dials: a global identity (checkLeader in
//     leadersession.go).
//
// Refusals are PermissionDenied, logged with the peer's identity and
// counted.

// peerCell returns the stream's verified cell identity. A peer whose
// certificate names no isobar identity, names one of another kind (a
// gateway, a region) or a cell of another region is refused: only the URI
// SAN spiffe://isobar/region/<region>/cell/<id> counts, never a common name
// or DNS SAN.
func (s *heartbeatService) peerCell(ctx context.Context) (certs.Identity, error) {
	id, err := certs.GRPCPeerIdentity(ctx)
	if err != nil {
		return certs.Identity{}, fmt.Errorf("%w: %w", ErrNoCellIdentity, err)
	}
	if id.Kind != certs.KindCell {
		return certs.Identity{}, fmt.Errorf("%w: certificate identity %s is not a cell", ErrNoCellIdentity, id)
	}
	if id.Region != s.region {
		return certs.Identity{}, fmt.Errorf("%w: certificate identity %s is a cell of region %s, this controller serves %s", ErrIdentityRegion, id, id.Region, s.region)
	}
	return id, nil
}

// identityMatches checks a heartbeat against the stream's cell identity.
func identityMatches(id certs.Identity, hb *isobarpb.CellHeartbeat) error {
	if hb.GetCellId() != id.Name {
		return fmt.Errorf("%w: cell %s presented a certificate for %s", ErrIdentityMismatch, trunc(hb.GetCellId()), id)
	}
	if hb.GetRegion() != id.Region {
		return fmt.Errorf("%w: cell %s says region %q, its certificate is for %s", ErrIdentityRegion, id.Name, trunc(hb.GetRegion()), id)
	}
	return nil
}

// peerName is the peer's certificate identity for logs.
func peerName(ctx context.Context) string { return certs.GRPCPeerName(ctx) }

// CellURI is the URI SAN that identifies cell id of region in its
// certificate.
func CellURI(region, id string) string { return certs.CellURI(region, id) }

// ErrNotGateway: an xDS or DataPlane client's certificate is not a gateway
// identity of this controller's region.
var ErrNotGateway = fmt.Errorf("regional: only this region's gateways (spiffe://isobar/gateway/<region>) may read xDS or report")

// gatewayPeer authorises an xDS or DataPlane client: its verified
// certificate must be spiffe://isobar/gateway/<region> of this region.
func gatewayPeer(ctx context.Context, region string) error {
	id, err := certs.GRPCPeerIdentity(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotGateway, err)
	}
	if id.Kind != certs.KindGateway || id.Name != region {
		return fmt.Errorf("%w: certificate identity %s, this controller serves %s", ErrNotGateway, id, region)
	}
	return nil
}
