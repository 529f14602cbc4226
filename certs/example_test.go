package certs_test

import (
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"github.com/isobar-mesh/isobar/certs"
)

// A lab or test creates a CA in-process, issues the identities it needs,
// writes them as the --tls-* files and loads them with the shared loaders.
func ExampleNewCA() {
	dir, err := os.MkdirTemp("", "pki")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ca, err := certs.NewCA(certs.CAConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ca.WriteDir(dir, false); err != nil {
		log.Fatal(err)
	}
	region := certs.Identity{Kind: certs.KindRegion, Name: "us-east"}
	is, err := ca.Issue(region.Leaf(nil, []net.IP{net.ParseIP("127.0.0.1")}))
	if err != nil {
		log.Fatal(err)
	}
	certFile, keyFile, err := certs.WriteLeaf(dir, "regional", is, false)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := certs.ServerConfig(certFile, keyFile, filepath.Join(dir, certs.CACertFile))
	if err != nil {
		log.Fatal(err)
	}
	id, _ := certs.PeerIdentity(is.Cert)
	fmt.Println(id.URI())
	fmt.Println(filepath.Base(certFile), filepath.Base(keyFile))
	fmt.Println(srv.ClientAuth)
	fmt.Println(certs.CellURI("us-east", "gpu0"))
	// Output:
	// spiffe://isobar/region/us-east
	// regional.pem regional-key.pem
	// RequireAndVerifyClientCert
	// spiffe://isobar/region/us-east/cell/gpu0
}
