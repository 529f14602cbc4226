package certs

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"io"
	"strings"
	"time"
)

// Describe writes a human-readable account of cert as of now: subject,
// issuer, serial, validity (and whether it holds now), CA flag, uses,
// SANs, isobar identity, key type and SHA-256 fingerprint. One field per
// line, each line indented by indent.
func Describe(w io.Writer, cert *x509.Certificate, now time.Time, indent string) error {
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%s%-12s %s\n", indent, k+":", v) }
	line("subject", cert.Subject.String())
	line("issuer", cert.Issuer.String())
	line("serial", cert.SerialNumber.Text(16))
	line("not before", cert.NotBefore.UTC().Format(time.RFC3339))
	line("not after", cert.NotAfter.UTC().Format(time.RFC3339)+" ("+validity(cert, now)+")")
	line("CA", fmt.Sprint(cert.IsCA))
	line("uses", uses(cert))
	if len(cert.URIs) > 0 {
		us := make([]string, len(cert.URIs))
		for i, u := range cert.URIs {
			us[i] = u.String()
		}
		line("URI SANs", strings.Join(us, ", "))
	}
	if len(cert.DNSNames) > 0 {
		line("DNS SANs", strings.Join(cert.DNSNames, ", "))
	}
	if len(cert.IPAddresses) > 0 {
		ips := make([]string, len(cert.IPAddresses))
		for i, ip := range cert.IPAddresses {
			ips[i] = ip.String()
		}
		line("IP SANs", strings.Join(ips, ", "))
	}
	if id, err := PeerIdentity(cert); err == nil {
		line("identity", id.Describe())
	} else if len(cert.URIs) > 0 {
		line("identity", "none ("+err.Error()+")")
	}
	line("key", keyType(cert))
	sum := sha256.Sum256(cert.Raw)
	line("sha256", fmt.Sprintf("%X", sum[:]))
	_, err := io.WriteString(w, b.String())
	return err
}

func validity(c *x509.Certificate, now time.Time) string {
	switch {
	case now.Before(c.NotBefore):
		return "NOT YET VALID, starts in " + roundDur(c.NotBefore.Sub(now))
	case now.After(c.NotAfter):
		return "EXPIRED " + roundDur(now.Sub(c.NotAfter)) + " ago"
	default:
		return "valid, expires in " + roundDur(c.NotAfter.Sub(now))
	}
}

// roundDur prints days for long spans and seconds precision otherwise.
func roundDur(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	return d.Round(time.Second).String()
}

func uses(c *x509.Certificate) string {
	var u []string
	if c.KeyUsage&x509.KeyUsageCertSign != 0 {
		u = append(u, "sign certificates")
	}
	for _, e := range c.ExtKeyUsage {
		switch e {
		case x509.ExtKeyUsageServerAuth:
			u = append(u, "server")
		case x509.ExtKeyUsageClientAuth:
			u = append(u, "client")
		case x509.ExtKeyUsageAny:
			u = append(u, "any")
		default:
			u = append(u, fmt.Sprintf("ext(%d)", e))
		}
	}
	if len(u) == 0 {
		return "unrestricted"
	}
	return strings.Join(u, ", ")
}

func keyType(c *x509.Certificate) string {
	switch k := c.PublicKey.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	default:
		return c.PublicKeyAlgorithm.String()
	}
}
