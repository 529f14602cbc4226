package certs

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ErrNotMTLS: a gRPC call's connection carries no TLS peer (plain text, or
// no peer information at all).
var ErrNotMTLS = errors.New("certs: the connection is not mTLS")

// GRPCPeerIdentity returns the isobar identity of the verified client (or
// server) certificate of the gRPC connection in ctx: ErrNotMTLS without
// TLS, else VerifiedIdentity's answer. Authorisation decisions take this
// and check the kind and name they need.
func GRPCPeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no peer information", ErrNotMTLS)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, ErrNotMTLS
	}
	return VerifiedIdentity(ti.State)
}

// GRPCPeerName describes the gRPC peer in ctx for logs: its isobar
// identity, else the certificate's common name and address, else its
// address.
func GRPCPeerName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "unknown"
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		c := ti.State.PeerCertificates[0]
		if id, err := PeerIdentity(c); err == nil {
			return id.String()
		}
		return fmt.Sprintf("CN=%s at %s", trunc(c.Subject.CommonName), p.Addr)
	}
	if p.Addr != nil {
		return "plaintext peer at " + p.Addr.String()
	}
	return "unknown"
}
