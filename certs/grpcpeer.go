package certs

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"

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

// GRPCPeerCertificate returns the verified leaf certificate of the gRPC
// connection in ctx (the one GRPCPeerIdentity reads the identity from):
// ErrNotMTLS without TLS, ErrNotIdentity without a verified chain. Callers
// read what the issuer bound to the identity, e.g. its IP SANs (see
// CertificateIPs).
func GRPCPeerCertificate(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: no peer information", ErrNotMTLS)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, ErrNotMTLS
	}
	cs := ti.State
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil, fmt.Errorf("%w: no verified peer certificate", ErrNotIdentity)
	}
	return cs.VerifiedChains[0][0], nil
}

// CertificateIPs returns a certificate's IP SANs as netip addresses
// (IPv4-mapped IPv6 forms unmapped), the form endpoints are compared in.
func CertificateIPs(cert *x509.Certificate) []netip.Addr {
	if cert == nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(cert.IPAddresses))
	for _, ip := range cert.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}
