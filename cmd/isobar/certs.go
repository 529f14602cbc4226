package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/certs"
)

// newCertsCmd is `isobar certs`: the development CA and certificates.
func newCertsCmd(ro *rootOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Development CA and certificates for mTLS between isobar components",
		Long: `certs creates a development certificate authority and issues the
certificates isobar's components present to each other over mTLS. Every
gRPC server and client takes --tls-cert, --tls-key and --tls-ca; the CA's
ca.pem is the --tls-ca bundle everywhere.

Identities are URI SANs (common names and DNS SANs never authorise):
  cellagent spiffe://isobar/region/<region>/cell/<cell-id>  cellagent (client)
  regional  spiffe://isobar/region/<region>                regional controller (server and client)
  global    spiffe://isobar/global/<name>                  global member (server and client)
  gateway   spiffe://isobar/gateway/<region>               Envoy or isobar gateway (client)
  operator  spiffe://isobar/operator/<name>                isobar chaos and other admin clients (client)

A cellagent may heartbeat only for the cell and region in its certificate, a
regional controller may publish only its own region's summary, only a global
identity may send plans, only a region's gateways may read its xDS, and
admin surfaces need an operator. The older cell form spiffe://isobar/cell/<id>
is refused: reissue such certificates with --role cellagent.

Files are never overwritten without --force. See deploy/README.md for
rotating certificates and the CA.`,
		Example: `  isobar certs init --dir pki
  isobar certs issue --dir pki --role regional --region us-east --dns isobar-regional --ip 127.0.0.1
  isobar certs issue --dir pki --role cellagent --cell gpu0 --region us-east
  isobar certs show pki/us-east.pem`,
		Args: certsNoArgs("certs"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("certs needs a subcommand: init, issue or show")}
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.AddCommand(newCertsInitCmd(ro), newCertsIssueCmd(ro), newCertsShowCmd(ro))
	return cmd
}

func certsNoArgs(name string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Errorf("%s takes no arguments, got %q", name, args)}
		}
		return nil
	}
}

func newCertsInitCmd(ro *rootOpts) *cobra.Command {
	var (
		dir, cn string
		ttl     time.Duration
		force   bool
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development CA (ca.pem, ca-key.pem) in a directory",
		Long: `init creates an ECDSA P-256 CA in --dir: ca.pem (0644, the trust bundle
for every --tls-ca) and ca-key.pem (0600). It refuses when either file
exists, unless --force; a new CA invalidates every certificate the old one
issued.`,
		Example: `  isobar certs init --dir pki
  isobar certs init --dir pki --ttl 2160h --force`,
		Args: certsNoArgs("certs init"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usageError{errors.New("--dir is required")}
			}
			if cmd.Flags().Changed("ttl") && ttl < time.Hour {
				return usageError{fmt.Errorf("--ttl %v: want at least 1h", ttl)}
			}
			ca, err := certs.NewCA(certs.CAConfig{CommonName: cn, TTL: ttl})
			if err != nil {
				return certsError(err)
			}
			if err := ca.WriteDir(dir, force); err != nil {
				return certsError(err)
			}
			c := ca.Certificate()
			fmt.Fprintf(ro.stdout, "created CA %q valid until %s\n  %s\n  %s\n", c.Subject.CommonName,
				c.NotAfter.UTC().Format(time.RFC3339), filepath.Join(dir, certs.CACertFile), filepath.Join(dir, certs.CAKeyFile))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&dir, "dir", "", "directory for ca.pem and ca-key.pem, created 0700 if missing (required)")
	fl.StringVar(&cn, "common-name", certs.DefaultCACommonName, "subject common name of the CA")
	fl.DurationVar(&ttl, "ttl", certs.DefaultCATTL, "validity of the CA")
	fl.BoolVar(&force, "force", false, "replace an existing CA")
	return cmd
}

type certsIssueFlags struct {
	dir, out, name, identity string
	role, cell, region       string
	uris, dns, ips           []string
	server, client, force    bool
	ttl                      time.Duration
}

func newCertsIssueCmd(ro *rootOpts) *cobra.Command {
	f := &certsIssueFlags{}
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue a certificate and key signed by the CA in --dir",
		Long: `issue signs a leaf certificate with the CA in --dir and writes
<name>.pem (0644) and <name>-key.pem (0600) into --out (default: --dir).

--role names the process the certificate is for and adds its identity URI
SAN and, unless --server or --client is given, the uses it needs:
  --role cellagent --cell ID --region R   spiffe://isobar/region/R/cell/ID (client)
  --role regional --region R              spiffe://isobar/region/R (server and client)
  --role global --name NAME               spiffe://isobar/global/NAME (server and client)
  --role gateway --region R               spiffe://isobar/gateway/R (client)
  --role operator --name NAME             spiffe://isobar/operator/NAME (client)
--name defaults to the cell id (cellagent), the region (regional) or
gateway-R (gateway). --identity KIND/NAME (or region/R/cell/ID) gives the
identity directly instead of --role. A server certificate needs a --dns or
--ip SAN for every address clients dial it by. A cellagent certificate
needs an --ip SAN for the IP it advertises as its endpoint: with mTLS the
regional controller refuses any other (--endpoint-binding=san, its
default; mapping or off relax it).

It refuses to replace existing files unless --force; a replacement is
atomic (rename), so a process never reads half a file.`,
		Example: `  isobar certs issue --dir pki --role regional --region us-east --dns isobar-regional --ip 127.0.0.1
  isobar certs issue --dir pki --role cellagent --cell gpu0 --region us-east --ip 10.0.0.7
  isobar certs issue --dir pki --role global --name g1 --dns isobar-global --ip 10.0.0.5
  isobar certs issue --dir pki --role operator --name alice
  isobar certs issue --dir pki --name envoy --identity gateway/us-east --ttl 720h`,
		Args: certsNoArgs("certs issue"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd, ro)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "CA directory made by isobar certs init (required)")
	fl.StringVar(&f.out, "out", "", "directory for the certificate and key (default: --dir)")
	fl.StringVar(&f.name, "name", "", "subject common name and file name: [A-Za-z0-9._-], at most 64 bytes; the identity's name with --role global or operator (required unless --role sets it)")
	fl.StringVar(&f.role, "role", "", "process the certificate is for: cellagent (needs --cell, --region), regional (--region), global (--name), gateway (--region) or operator (--name)")
	fl.StringVar(&f.cell, "cell", "", "cell id, with --role cellagent")
	fl.StringVar(&f.region, "region", "", "region, with --role cellagent, regional or gateway")
	fl.StringVar(&f.identity, "identity", "", "isobar identity KIND/NAME (region/R/cell/ID for a cell), KIND one of region, global, gateway, operator; instead of --role")
	fl.StringArrayVar(&f.uris, "uri", nil, "URI SAN (repeatable), e.g. spiffe://isobar/region/<region>/cell/<cell-id>")
	fl.StringArrayVar(&f.dns, "dns", nil, "DNS SAN (repeatable)")
	fl.StringArrayVar(&f.ips, "ip", nil, "IP SAN (repeatable)")
	fl.BoolVar(&f.server, "server", false, "allow server use (TLS server authentication)")
	fl.BoolVar(&f.client, "client", false, "allow client use (TLS client authentication)")
	fl.DurationVar(&f.ttl, "ttl", certs.DefaultLeafTTL, "validity, at most until the CA expires")
	fl.BoolVar(&f.force, "force", false, "replace existing files")
	return cmd
}

// roleIdentity turns --role and the flags it needs into an identity, and
// fills in the default --name. Errors name the missing or misplaced flag.
func (f *certsIssueFlags) roleIdentity() (certs.Identity, error) {
	need := func(flag, val string) error {
		if val == "" {
			return fmt.Errorf("--role %s needs %s", f.role, flag)
		}
		return nil
	}
	refuse := func(flag, val string) error {
		if val != "" {
			return fmt.Errorf("--role %s takes no %s", f.role, flag)
		}
		return nil
	}
	var id certs.Identity
	var err error
	switch f.role {
	case "cellagent":
		err = errors.Join(need("--cell", f.cell), need("--region", f.region))
		id = certs.CellIdentity(f.region, f.cell)
		if f.name == "" {
			f.name = f.cell
		}
	case "regional":
		err = errors.Join(need("--region", f.region), refuse("--cell", f.cell))
		id = certs.Identity{Kind: certs.KindRegion, Name: f.region}
		if f.name == "" {
			f.name = f.region
		}
	case "gateway":
		err = errors.Join(need("--region", f.region), refuse("--cell", f.cell))
		id = certs.Identity{Kind: certs.KindGateway, Name: f.region}
		if f.name == "" && f.region != "" {
			f.name = "gateway-" + f.region
		}
	case "global", "operator":
		err = errors.Join(need("--name", f.name), refuse("--cell", f.cell), refuse("--region", f.region))
		id = certs.Identity{Kind: certs.KindGlobal, Name: f.name}
		if f.role == "operator" {
			id.Kind = certs.KindOperator
		}
	default:
		return certs.Identity{}, fmt.Errorf("--role %q: want cellagent, regional, global, gateway or operator", f.role)
	}
	if err != nil {
		return certs.Identity{}, err
	}
	if err := id.Validate(); err != nil {
		return certs.Identity{}, fmt.Errorf("--role %s: %w", f.role, err)
	}
	return id, nil
}

func (f *certsIssueFlags) run(cmd *cobra.Command, ro *rootOpts) error {
	var roleID *certs.Identity
	switch {
	case f.role != "" && f.identity != "":
		return usageError{errors.New("give --role or --identity, not both")}
	case f.role == "" && (f.cell != "" || f.region != ""):
		return usageError{errors.New("--cell and --region need --role")}
	case f.role != "":
		id, err := f.roleIdentity()
		if err != nil {
			return usageError{err}
		}
		roleID = &id
	}
	switch {
	case f.dir == "":
		return usageError{errors.New("--dir is required")}
	case f.name == "":
		return usageError{errors.New("--name is required")}
	}
	leaf := certs.Leaf{Name: f.name, URIs: f.uris, DNS: f.dns, Server: f.server, Client: f.client}
	if cmd.Flags().Changed("ttl") {
		if f.ttl < time.Minute {
			return usageError{fmt.Errorf("--ttl %v: want at least 1m", f.ttl)}
		}
		leaf.TTL = f.ttl
	}
	if f.identity != "" {
		id, err := certs.ParseIdentity(f.identity)
		if err != nil {
			return usageError{fmt.Errorf("--identity %q: want KIND/NAME with KIND one of region, global, gateway, operator, or region/R/cell/ID: %w", f.identity, err)}
		}
		roleID = &id
	}
	if roleID != nil {
		id := *roleID
		def := id.Leaf(nil, nil)
		leaf.URIs = append([]string{id.URI()}, leaf.URIs...)
		if !f.server && !f.client {
			leaf.Server, leaf.Client = def.Server, def.Client
		}
	}
	if !leaf.Server && !leaf.Client {
		return usageError{errors.New("give --server, --client or both (or --role for the defaults)")}
	}
	for _, s := range f.ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return usageError{fmt.Errorf("--ip %q is not an IP address", s)}
		}
		leaf.IPs = append(leaf.IPs, ip)
	}
	ca, err := certs.LoadCA(f.dir)
	if err != nil {
		return certsError(err)
	}
	is, err := ca.Issue(leaf)
	if err != nil {
		return certsError(err)
	}
	out := f.out
	if out == "" {
		out = f.dir
	}
	certPath, keyPath, err := certs.WriteLeaf(out, f.name, is, f.force)
	if err != nil {
		return certsError(err)
	}
	fmt.Fprintf(ro.stdout, "issued %s\n  %s\n  %s\n", f.name, certPath, keyPath)
	if roleID != nil && roleID.Kind == certs.KindCell && len(leaf.IPs) == 0 {
		fmt.Fprintf(ro.stderr, "note: %s has no --ip SAN; a regional controller with mTLS (--endpoint-binding=san, the default) refuses every endpoint it advertises unless it runs with --endpoint-binding=mapping or off\n", f.name)
	}
	return certs.Describe(ro.stdout, is.Cert, time.Now(), "  ")
}

func newCertsShowCmd(ro *rootOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "show FILE...",
		Short: "Print the subject, SANs, uses and validity of certificates",
		Long: `show prints every certificate in each FILE (PEM, or DER): subject,
issuer, serial, validity and whether it holds now, uses, URI/DNS/IP SANs,
the isobar identity and the SHA-256 fingerprint. It exits 1 when a file
holds no certificate.`,
		Example: `  isobar certs show pki/ca.pem pki/us-east.pem`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("show needs at least one FILE")}
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			now := time.Now()
			for _, file := range args {
				data, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				cs, err := certs.ParseCertificates(data)
				if err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
				for i, c := range cs {
					fmt.Fprintf(ro.stdout, "%s: certificate %d of %d\n", file, i+1, len(cs))
					if err := certs.Describe(ro.stdout, c, now, "  "); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
}

// certsError marks library errors caused by bad flag values as usage
// errors (exit 2); the rest (existing files, unreadable CA) exit 1.
func certsError(err error) error {
	if errors.Is(err, certs.ErrInvalid) && !errors.Is(err, certs.ErrExists) {
		return usageError{err}
	}
	return err
}
