package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"

	"github.com/isobar-mesh/isobar/internal/truncate"
)

// TrustDomain is the SPIFFE trust domain of every isobar identity.
const TrustDomain = "isobar"

// Kind is the role an identity names.
type Kind string

// Identity kinds. Each process presents a certificate whose URI SAN is
// spiffe://isobar/<kind>/<name>, except cells:
// spiffe://isobar/region/<region>/cell/<id>.
const (
	// KindCell is a cellagent; the name is its cell id and the identity
	// also carries the cell's region. Regional controllers refuse
	// heartbeats whose cell id or region differs.
	KindCell Kind = "cell"
	// KindRegion is a regional controller; the name is its region. The
	// global leader refuses summaries for any other region.
	KindRegion Kind = "region"
	// KindGlobal is a member of the global HA pair; the name is its member
	// name (isobar global --name).
	KindGlobal Kind = "global"
	// KindGateway is a region's data plane (Envoy or isobar gateway); the
	// name is the region whose controller it reads xDS from.
	KindGateway Kind = "gateway"
	// KindOperator is a person or tool allowed to drive admin surfaces
	// (isobar chaos against the lab's admin API); the name is the
	// operator's.
	KindOperator Kind = "operator"
)

// Kinds lists every identity kind.
func Kinds() []Kind { return []Kind{KindCell, KindRegion, KindGlobal, KindGateway, KindOperator} }

// maxNameLen bounds an identity or certificate name (the cellagent's
// cell-id limit).
const maxNameLen = 128

// Identity is an isobar workload identity.
type Identity struct {
	Kind Kind
	Name string
	// Region is the region of a cell (KindCell only; empty for every other
	// kind, whose region, where they have one, is their Name).
	Region string
}

// CellURI is the URI SAN of the certificate of cell id in region:
// spiffe://isobar/region/<region>/cell/<id>.
func CellURI(region, id string) string { return CellIdentity(region, id).URI() }

// CellIdentity is the identity of cell id in region.
func CellIdentity(region, id string) Identity {
	return Identity{Kind: KindCell, Name: id, Region: region}
}

// RegionURI is the URI SAN of a regional controller's certificate.
func RegionURI(region string) string { return Identity{Kind: KindRegion, Name: region}.URI() }

// GlobalURI is the URI SAN of a global member's certificate.
func GlobalURI(name string) string { return Identity{Kind: KindGlobal, Name: name}.URI() }

// GatewayURI is the URI SAN of a region's data plane (Envoy or gateway).
func GatewayURI(region string) string { return Identity{Kind: KindGateway, Name: region}.URI() }

// OperatorURI is the URI SAN of an operator's client certificate, the
// identity admin surfaces require.
func OperatorURI(name string) string { return Identity{Kind: KindOperator, Name: name}.URI() }

// URI returns spiffe://isobar/<kind>/<name>, or for a cell
// spiffe://isobar/region/<region>/cell/<id>. It does not validate.
func (id Identity) URI() string {
	if id.Kind == KindCell {
		return "spiffe://" + TrustDomain + "/" + string(KindRegion) + "/" + id.Region + "/" + string(KindCell) + "/" + id.Name
	}
	return "spiffe://" + TrustDomain + "/" + string(id.Kind) + "/" + id.Name
}

// String returns the URI.
func (id Identity) String() string { return id.URI() }

// Validate checks the kind is known, the name (and a cell's region) is
// 1-128 bytes of [A-Za-z0-9._-], and only a cell carries a Region.
func (id Identity) Validate() error {
	switch id.Kind {
	case KindCell, KindRegion, KindGlobal, KindGateway, KindOperator:
	default:
		return fmt.Errorf("%w: identity kind %q: want one of cell, region, global, gateway, operator", ErrInvalid, id.Kind)
	}
	if err := checkName(id.Name); err != nil {
		return fmt.Errorf("identity %s name: %w", id.Kind, err)
	}
	if id.Kind == KindCell {
		if err := checkName(id.Region); err != nil {
			return fmt.Errorf("identity cell %s region: %w", id.Name, err)
		}
	} else if id.Region != "" {
		return fmt.Errorf("%w: identity %s/%s: only a cell identity carries a region", ErrInvalid, id.Kind, id.Name)
	}
	return nil
}

// ParseIdentity parses spiffe://isobar/<kind>/<name> or
// spiffe://isobar/region/<region>/cell/<id>, or the short forms without
// "spiffe://isobar/" used on command lines. Anything else wraps
// ErrNotIdentity; a known shape with a bad kind or name also wraps
// ErrInvalid.
//
// The older cell form spiffe://isobar/cell/<id>, which named no region, is
// refused (ErrNotIdentity and ErrInvalid) with a message saying how to
// reissue the certificate: a cell identity must bind the region too.
func ParseIdentity(s string) (Identity, error) {
	rest, ok := strings.CutPrefix(s, "spiffe://"+TrustDomain+"/")
	if !ok {
		if strings.Contains(s, "://") {
			return Identity{}, fmt.Errorf("%w: %q is not under spiffe://%s/", ErrNotIdentity, trunc(s), TrustDomain)
		}
		rest = s
	}
	kind, name, ok := strings.Cut(rest, "/")
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q: want <kind>/<name>", ErrNotIdentity, trunc(s))
	}
	id := Identity{Kind: Kind(kind), Name: name}
	switch {
	case id.Kind == KindCell:
		return Identity{}, fmt.Errorf("%w: %w: %q is the older cell identity without a region; reissue it as region/<region>/cell/<id> (isobar certs issue --role cellagent --cell ID --region R)",
			ErrNotIdentity, ErrInvalid, trunc(s))
	case id.Kind == KindRegion && strings.Contains(name, "/"):
		region, cell, ok := strings.Cut(name, "/"+string(KindCell)+"/")
		if !ok {
			return Identity{}, fmt.Errorf("%w: %q: want region/<region> or region/<region>/cell/<id>", ErrNotIdentity, trunc(s))
		}
		id = CellIdentity(region, cell)
	}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrNotIdentity, err)
	}
	return id, nil
}

// Describe is the identity in words: "cell <id> in region <region>" or
// "<kind> <name>".
func (id Identity) Describe() string {
	if id.Kind == KindCell {
		return string(id.Kind) + " " + id.Name + " in region " + id.Region
	}
	return string(id.Kind) + " " + id.Name
}

// PeerIdentity returns the isobar identity in a certificate's URI SANs.
// A certificate with none, or with two different ones, wraps ErrNotIdentity.
func PeerIdentity(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrNotIdentity)
	}
	var found []Identity
	for _, u := range cert.URIs {
		if u == nil || u.Scheme != "spiffe" || u.Host != TrustDomain {
			continue
		}
		id, err := ParseIdentity(u.String())
		if err != nil {
			return Identity{}, err
		}
		if len(found) == 0 || found[0] != id {
			found = append(found, id)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no spiffe://%s/ URI SAN", ErrNotIdentity, cert.Subject.CommonName, TrustDomain)
	case 1:
		return found[0], nil
	default:
		return Identity{}, fmt.Errorf("%w: certificate %q names %d identities", ErrNotIdentity, cert.Subject.CommonName, len(found))
	}
}

// Leaf returns the certificate request for this identity: common name =
// the identity's name, URI SAN = its URI, the given DNS and IP SANs, and
// the extended key usages its process needs (cell and gateway: client;
// region and global: server and client). Add DNS/IP SANs for every address
// peers dial a server by.
func (id Identity) Leaf(dns []string, ips []net.IP) Leaf {
	l := Leaf{Name: id.Name, URIs: []string{id.URI()}, DNS: dns, IPs: ips, Client: true}
	switch id.Kind {
	case KindRegion, KindGlobal:
		l.Server = true
	}
	return l
}

// checkName accepts 1-128 bytes of [A-Za-z0-9._-] that are not "." or "..".
func checkName(s string) error {
	if s == "" || len(s) > maxNameLen {
		return fmt.Errorf("%w: name %q: want 1-%d characters", ErrInvalid, trunc(s), maxNameLen)
	}
	if s == "." || s == ".." {
		return fmt.Errorf("%w: name %q is not allowed", ErrInvalid, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' {
			continue
		}
		return fmt.Errorf("%w: name %q: only letters, digits, '.', '_' and '-' are allowed", ErrInvalid, trunc(s))
	}
	return nil
}

// trunc bounds outside input quoted in error messages.
func trunc(s string) string { return truncate.Marked(s, 160, "...") }

// VerifiedIdentity returns the isobar identity of the peer's verified leaf
// certificate in a TLS connection state: the one servers and clients
// authorise by. A connection without a verified chain, or whose leaf names
// no single isobar identity, wraps ErrNotIdentity. Common names and DNS
// SANs never count as identities.
func VerifiedIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified peer certificate", ErrNotIdentity)
	}
	return PeerIdentity(cs.VerifiedChains[0][0])
}
