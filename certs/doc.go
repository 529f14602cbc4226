// Package certs is isobar's development PKI and the one place every
// component loads its mTLS configuration from.
//
// # What it owns
//
//   - A development CA (NewCA, LoadCA, CA.WriteDir): an ECDSA P-256
//     self-signed root, one year by default, that signs leaves directly (no
//     intermediates, no name constraints). A CA directory holds ca.pem (the
//     trust bundle, 0644) and ca-key.pem (0600; LoadCA refuses a key file
//     readable by group or others). Files are never overwritten unless asked
//     (ErrExists); an overwrite replaces each file atomically by rename.
//   - Leaf certificates (CA.Issue, WriteLeaf, CA.IssueTo): ECDSA P-256 keys in PKCS#8,
//     server and/or client extended key usage, URI/DNS/IP SANs, 90 days by
//     default and never beyond the CA. A server leaf must carry a DNS or IP
//     SAN for the addresses clients dial.
//   - isobar identities: spiffe://isobar/<kind>/<name> URI SANs for
//     regional controllers (region), global members (member name), gateways
//     (region) and operators, and spiffe://isobar/region/<region>/cell/<id>
//     for cells, which binds a cell to its region: CellURI, RegionURI,
//     GlobalURI, GatewayURI, OperatorURI, ParseIdentity, PeerIdentity,
//     VerifiedIdentity and Identity.Leaf, which picks the key usages each
//     process needs. Only these URI SANs are identities; common names and
//     DNS SANs never authorise anything. The older cell form
//     spiffe://isobar/cell/<id> is refused (reissue the certificate).
//   - TLS configuration (ServerConfig, ClientConfig): TLS 1.3, client
//     certificates required and verified on servers; WithPeer adds an
//     identity check of the peer to the handshake (a client that may reach
//     only one controller, say). Loading checks the
//     files up front and says which flag (--tls-cert, --tls-key, --tls-ca)
//     and file is wrong: unreadable, not PEM, key mismatch, expired, not
//     chained to the bundle or issued for the wrong role.
//   - Describe, the text of isobar certs show.
//
// # Rotation
//
// Leaf pairs are re-read when their files change: each handshake stats the
// two files (no goroutine, no timer) and reloads when size, modification
// time or file identity differ, keeping the last good pair when the new one
// fails the load checks (a half-written pair, a key that does not match
// yet). Established connections keep their certificate; new connections
// get the new one. Replace a leaf with isobar certs issue --force (atomic
// rename, key first) or a Kubernetes Secret update. The CA bundle is read
// once per ServerConfig/ClientConfig call; to rotate the CA append the new
// root to every ca.pem and restart, reissue every leaf from the new CA, then
// remove the old root and restart again.
//
// # Time and concurrency
//
// Validity periods and handshake verification use the clock given by
// WithClock (default real), so tests can issue and check certificates at
// chosen instants. A CA holds no mutable state and is safe for concurrent
// use; the tls.Configs returned are safe for concurrent handshakes (a mutex
// guards the reloadable pair). The package starts no goroutines.
//
// # Errors
//
// Every error wraps one class: ErrInvalid (bad request; fix the flag),
// ErrExists, ErrNoCertificate, ErrBadKey, ErrInsecureKey, ErrExpired,
// ErrUntrusted, ErrNotIdentity. Use errors.Is.
package certs
