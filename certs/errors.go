package certs

import "errors"

// Error classes. Every error the package returns wraps exactly one of these;
// test with errors.Is.
var (
	// ErrInvalid: a CAConfig, Leaf, Identity or name is not acceptable (the
	// message names the field). Bad input from a command line; fix the flag.
	ErrInvalid = errors.New("certs: invalid request")
	// ErrExists: a file would be overwritten and overwriting was not asked
	// for (isobar certs ... --force).
	ErrExists = errors.New("certs: file exists")
	// ErrNoCertificate: a file holds no PEM or DER certificate that parses.
	ErrNoCertificate = errors.New("certs: no certificate")
	// ErrBadKey: a private key file does not parse, is not ECDSA, RSA or
	// Ed25519, or does not match its certificate.
	ErrBadKey = errors.New("certs: unusable private key")
	// ErrInsecureKey: a CA key file can be read by group or others.
	ErrInsecureKey = errors.New("certs: private key file readable by others")
	// ErrExpired: a certificate is outside its validity period (expired or
	// not yet valid) at the time of the check.
	ErrExpired = errors.New("certs: certificate outside its validity period")
	// ErrUntrusted: a certificate does not chain to the given CA bundle for
	// the role (server or client) it is loaded for.
	ErrUntrusted = errors.New("certs: certificate not trusted by the CA bundle")
	// ErrNotIdentity: a URI or certificate carries no isobar identity
	// (spiffe://isobar/<kind>/<name>).
	ErrNotIdentity = errors.New("certs: not an isobar identity")
)
