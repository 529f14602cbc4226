package lab

import (
	"crypto/rand"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/isobar-mesh/isobar/certs"
)

// pki issues the run's certificates from a development CA; with insecure
// set it issues nothing and every link is plaintext.
type pki struct {
	dir      string
	ca       string
	insecure bool
	ca0      *certs.CA
	// gossipKey is the gossip cluster key every region's member shares
	// (with mTLS, gossip requires one: regional/gossip Identity).
	gossipKey []byte

	mu     sync.Mutex
	issued map[string]identity // by name: a restarted component reuses its files
}

// identity is one component's certificate files.
type identity struct{ cert, key string }

func newPKI(dir string, insecure bool) (*pki, error) {
	p := &pki{dir: filepath.Join(dir, "pki"), insecure: insecure}
	if insecure {
		return p, nil
	}
	ca, err := certs.NewCA(certs.CAConfig{CommonName: "isobar lab CA"})
	if err != nil {
		return nil, err
	}
	if err := ca.WriteDir(p.dir, false); err != nil {
		return nil, err
	}
	p.ca0, p.ca = ca, filepath.Join(p.dir, "ca.pem")
	p.gossipKey = make([]byte, 32)
	if _, err := rand.Read(p.gossipKey); err != nil {
		return nil, err
	}
	return p, nil
}

// issue writes a certificate for name with the given URI SAN, valid for
// 127.0.0.1, usable as server and client.
func (p *pki) issue(name, uri string) (identity, error) {
	if p.insecure {
		return identity{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.issued[name]; ok {
		return id, nil
	}
	l := certs.Leaf{Name: name, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true, Client: true}
	if uri != "" {
		l.URIs = []string{uri}
	}
	c, k, err := p.ca0.IssueTo(p.dir, l, false)
	if err != nil {
		return identity{}, fmt.Errorf("lab: issue %s: %w", name, err)
	}
	id := identity{cert: c, key: k}
	if p.issued == nil {
		p.issued = map[string]identity{}
	}
	p.issued[name] = id
	return id, nil
}

// dial returns gRPC dial options presenting id (plaintext when insecure).
func (p *pki) dial(id identity) ([]grpc.DialOption, error) {
	if p.insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	tc, err := certs.ClientConfig(id.cert, id.key, p.ca, "")
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}
