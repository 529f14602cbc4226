package regional

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"slices"
	"strings"

	"github.com/isobar-mesh/isobar/certs"
)

// Endpoint binding: with mTLS a cell's identity says which cell it is; the
// binding says which addresses that identity may put into the region's
// EDS. Without it a cell (or a stolen cell certificate) could advertise any
// address: another cell's, to shut it out as an endpoint conflict, or one
// outside the fleet, to receive users' prompts.

// EndpointBinding is how a cell's advertised endpoint is checked against
// its certificate identity (Config.EndpointBinding, --endpoint-binding).
type EndpointBinding string

const (
	// BindSAN (the default with mTLS): the endpoint's IP must be one of the
	// IP SANs of the cell's verified certificate (isobar certs issue --ip,
	// or a per-pod issuer such as cert-manager's csi-driver with
	// csi.cert-manager.io/ip-sans: ${POD_IP}). DNS SANs are not used:
	// endpoints are IPs (EDS refuses names) and resolving a name would trust
	// DNS rather than the issuer.
	BindSAN EndpointBinding = "san"
	// BindMapping: the endpoint's IP must be an IP SAN of the certificate
	// or lie in a prefix that Config.EndpointMap lists for the cell id (for
	// fleets whose certificates are issued before the address is known,
	// e.g. pod IPs: map the cells to the pod CIDR).
	BindMapping EndpointBinding = "mapping"
	// BindOff: any endpoint is taken (the default without mTLS, where
	// there are no identities). With mTLS the operator must say so.
	BindOff EndpointBinding = "off"
)

// EndpointBindings lists the modes, for flag help and validation.
func EndpointBindings() []EndpointBinding { return []EndpointBinding{BindSAN, BindMapping, BindOff} }

// ErrEndpointNotAllowed: a cell advertised an endpoint that its certificate
// does not allow under the controller's endpoint binding. The heartbeat
// stream is refused (PermissionDenied), counted as
// isobar_regional_heartbeats_rejected_total{reason="endpoint_not_allowed"}.
var ErrEndpointNotAllowed = errors.New("regional: advertised endpoint not allowed for the cell's identity")

// ErrInvalidEndpointMap wraps every ParseEndpointMap error.
var ErrInvalidEndpointMap = errors.New("regional: invalid endpoint map")

// EndpointMap maps cell ids to the address prefixes they may advertise
// (BindMapping). Immutable once parsed; safe for concurrent use.
type EndpointMap struct {
	rules []endpointRule
}

type endpointRule struct {
	pattern  string // path.Match pattern over the cell id
	prefixes []netip.Prefix
}

// Endpoint map limits: the file is operator input, bounded all the same.
const (
	maxEndpointMapBytes    = 1 << 20
	maxEndpointMapRules    = 10_000
	maxEndpointMapPrefixes = 64 // per line
)

// ParseEndpointMap parses an endpoint map: one rule per line,
//
//	<cell-id pattern> <IP or CIDR> [<IP or CIDR> ...]
//
// fields separated by spaces, tabs or commas; '#' starts a comment. The
// pattern is a path.Match glob over the cell id of this region (gpu-*,
// gpu-[0-7], or * for every cell); a cell may advertise an address in any
// prefix of any rule that matches it. A bare IP is a /32 (/128). For
// example
//
//	# every cell in the pod network; gpu-0 also on its host address
//	*      10.244.0.0/16
//	gpu-0  192.0.2.10
func ParseEndpointMap(text string) (*EndpointMap, error) {
	if len(text) > maxEndpointMapBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidEndpointMap, len(text), maxEndpointMapBytes)
	}
	m := &EndpointMap{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), maxEndpointMapBytes)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' || r == '\r' })
		if len(fields) == 0 {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: line %d: %s", ErrInvalidEndpointMap, n, fmt.Sprintf(format, a...))
		}
		if len(fields) < 2 {
			return nil, bad("%q: want a cell-id pattern and at least one IP or CIDR", trunc(line))
		}
		if len(fields) > 1+maxEndpointMapPrefixes {
			return nil, bad("%d prefixes, at most %d a line", len(fields)-1, maxEndpointMapPrefixes)
		}
		if len(m.rules) == maxEndpointMapRules {
			return nil, bad("more than %d rules", maxEndpointMapRules)
		}
		r := endpointRule{pattern: fields[0]}
		if _, err := path.Match(r.pattern, "x"); err != nil || len(r.pattern) > 256 {
			return nil, bad("pattern %q: want a glob over cell ids (gpu-*, gpu-[0-7], *)", trunc(r.pattern))
		}
		for _, f := range fields[1:] {
			p, err := parsePrefix(f)
			if err != nil {
				return nil, bad("%v", err)
			}
			r.prefixes = append(r.prefixes, p)
		}
		m.rules = append(m.rules, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidEndpointMap, err)
	}
	if len(m.rules) == 0 {
		return nil, fmt.Errorf("%w: no rules (want lines of <cell-id pattern> <IP or CIDR>...)", ErrInvalidEndpointMap)
	}
	return m, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix (10.244.0.0/16, 2001:db8::/64)", trunc(s))
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q: zones are not allowed", trunc(s))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR prefix", trunc(s))
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Allows reports whether cell may advertise a.
func (m *EndpointMap) Allows(cell string, a netip.Addr) bool {
	if m == nil {
		return false
	}
	a = a.Unmap()
	for _, r := range m.rules {
		if ok, _ := path.Match(r.pattern, cell); !ok {
			continue
		}
		if slices.ContainsFunc(r.prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return true
		}
	}
	return false
}

// endpointBinder applies Config.EndpointBinding to heartbeats. Immutable;
// shared by every heartbeat stream.
type endpointBinder struct {
	mode EndpointBinding
	m    *EndpointMap
}

// endpointGrant is what a stream's certificate allows: its identity and IP
// SANs. Built once per stream (the certificate cannot change within it).
type endpointGrant struct {
	id  certs.Identity
	ips []netip.Addr
}

// grant reads the stream's verified certificate for id.
func (b endpointBinder) grant(ctx context.Context, id certs.Identity) endpointGrant {
	g := endpointGrant{id: id}
	if b.mode == BindOff {
		return g
	}
	if leaf, err := certs.GRPCPeerCertificate(ctx); err == nil {
		g.ips = certs.CertificateIPs(leaf)
	}
	return g
}

// allow checks that g may advertise ep (already validated as IP:port).
// The port is not bound: a certificate names hosts, not ports.
func (b endpointBinder) allow(g endpointGrant, ep string) error {
	if b.mode == BindOff {
		return nil
	}
	host, _, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("%w: cell %s: endpoint %q is not host:port", ErrEndpointNotAllowed, g.id.Name, trunc(ep))
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: cell %s: endpoint host %q is not an IP", ErrEndpointNotAllowed, g.id.Name, trunc(host))
	}
	a = a.Unmap()
	if slices.Contains(g.ips, a) {
		return nil
	}
	if b.mode == BindMapping && b.m.Allows(g.id.Name, a) {
		return nil
	}
	fix := fmt.Sprintf("reissue the cell's certificate with --ip %s (isobar certs issue --role cellagent), "+
		"or map the cell to the address with --endpoint-binding=mapping --endpoint-map-file, "+
		"or run the controller with --endpoint-binding=off", a)
	if b.mode == BindMapping {
		fix = fmt.Sprintf("add a line for the cell covering %s to --endpoint-map-file, reissue its certificate with --ip %s, "+
			"or run the controller with --endpoint-binding=off", a, a)
	}
	return fmt.Errorf("%w: cell %s advertises %s; its certificate %s allows IP SANs %v (endpoint binding %s): %s",
		ErrEndpointNotAllowed, g.id.Name, trunc(ep), g.id, g.ips, b.mode, fix)
}

// validateEndpointBinding checks Config's binding against its TLS setting.
func (c Config) validateEndpointBinding() error {
	switch mode := c.endpointBinding(); mode {
	case BindOff:
	case BindSAN, BindMapping:
		if !c.TLS.Enabled() {
			return fmt.Errorf("%w: --endpoint-binding=%s needs mTLS (--tls-cert, --tls-key, --tls-ca): without certificates there is no identity to bind endpoints to; use --endpoint-binding=off with --insecure",
				ErrInvalidConfig, mode)
		}
		if mode == BindMapping && c.EndpointMap == nil {
			return fmt.Errorf("%w: --endpoint-binding=mapping needs --endpoint-map-file", ErrInvalidConfig)
		}
	default:
		return fmt.Errorf("%w: endpoint binding %q: want one of %v", ErrInvalidConfig, trunc(string(c.EndpointBinding)), EndpointBindings())
	}
	if c.EndpointMap != nil && c.endpointBinding() != BindMapping {
		return fmt.Errorf("%w: an endpoint map is given but --endpoint-binding is %s; set --endpoint-binding=mapping or drop --endpoint-map-file", ErrInvalidConfig, c.endpointBinding())
	}
	return nil
}

// endpointBinding is the binding in force: EndpointBinding, or when it is
// empty strict (san) with mTLS and off without. Strict by default because
// with mTLS the operator has said that identities matter, and an unbound
// endpoint lets one cell certificate steer traffic to any address; a fleet
// whose certificates cannot carry the address says so with mapping or off.
func (c Config) endpointBinding() EndpointBinding {
	switch {
	case c.EndpointBinding != "":
		return c.EndpointBinding
	case c.TLS.Enabled():
		return BindSAN
	}
	return BindOff
}
