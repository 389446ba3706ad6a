// Package pki makes the certificates of a MemoryFS cluster: a CA, node
// certificates (server and client use, the "node" role) and client
// certificates (a "read", "write" or "admin" role), with the standard
// library only, written as PEM files in the layout etcd and cert-manager
// use (ca.crt, NAME.crt, NAME.key), so an operator's own CA serves the same.
//
// The role is the certificate's Subject OrganizationalUnit. This package
// never reads or enforces roles (package server does) and never touches
// the network.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Role names carried in a certificate's OrganizationalUnit.
const (
	RoleNode  = "node"
	RoleAdmin = "admin"
	RoleWrite = "write"
	RoleRead  = "read"
)

// PathScheme is the scheme of the URI SAN that confines a client
// certificate to a directory: "memfs-path:/tenants/a".
const PathScheme = "memfs-path"

// Key types.
const (
	Ed25519 = "ed25519"
	ECDSA   = "ecdsa" // P-256
)

// File names in a certificate directory.
const (
	CAFile    = "ca.crt"
	CAKeyFile = "ca.key"
)

// CertFile and KeyFile name the files of certificate name in a directory.
func CertFile(dir, name string) string { return filepath.Join(dir, name+".crt") }

// KeyFile: see CertFile.
func KeyFile(dir, name string) string { return filepath.Join(dir, name+".key") }

// Pair is a certificate with its private key.
type Pair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Request describes a certificate to issue.
type Request struct {
	Name  string   // Subject CommonName
	Role  string   // RoleNode, RoleAdmin, RoleWrite or RoleRead
	Hosts []string // SANs: IP addresses and DNS names (nodes)
	// Path confines a read or write client to a directory: a URI SAN
	// PathScheme:PATH (docs/security.md, "Confinement").
	Path    string
	TTL     time.Duration // validity from now (one year when 0)
	KeyType string        // Ed25519 (default) or ECDSA
	// NotBefore, when set, replaces "one minute ago" (tests make expired
	// certificates with it).
	NotBefore time.Time
}

func newKey(kind string) (crypto.Signer, error) {
	switch kind {
	case "", Ed25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	case ECDSA:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	return nil, fmt.Errorf("unknown key type %q (want ed25519 or ecdsa)", kind)
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// base is what every certificate starts from: a new key, a random serial
// and the validity r asks for.
func base(r Request) (crypto.Signer, *x509.Certificate, error) {
	key, err := newKey(r.KeyType)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	nb, na := validity(r)
	return key, &x509.Certificate{SerialNumber: sn, NotBefore: nb, NotAfter: na}, nil
}

func validity(r Request) (time.Time, time.Time) {
	ttl := r.TTL
	if ttl == 0 {
		ttl = 365 * 24 * time.Hour
	}
	nb := r.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Minute) // tolerate clocks a little behind
	}
	return nb, nb.Add(ttl)
}

// NewCA makes a self-signed CA (ten years when r.TTL is 0).
func NewCA(r Request) (*Pair, error) {
	if r.TTL == 0 {
		r.TTL = 10 * 365 * 24 * time.Hour
	}
	if r.Name == "" {
		r.Name = "memfs CA"
	}
	key, tmpl, err := base(r)
	if err != nil {
		return nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: r.Name, Organization: []string{"MemoryFS"}}
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid, tmpl.IsCA, tmpl.MaxPathLenZero = true, true, true
	return sign(tmpl, key, tmpl, key)
}

// Issue makes a certificate signed by ca.
func (ca *Pair) Issue(r Request) (*Pair, error) {
	switch r.Role {
	case RoleNode, RoleAdmin, RoleWrite, RoleRead:
	default:
		return nil, fmt.Errorf("unknown role %q (want node, admin, write or read)", r.Role)
	}
	if r.Name == "" {
		return nil, errors.New("certificate name is empty")
	}
	key, tmpl, err := base(r)
	if err != nil {
		return nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: r.Name, Organization: []string{"MemoryFS"}, OrganizationalUnit: []string{r.Role}}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, ok := ca.Key.(*ecdsa.PrivateKey); ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	if r.Path != "" {
		if r.Role != RoleRead && r.Role != RoleWrite {
			return nil, fmt.Errorf("a %s certificate cannot be confined to a path (only read and write)", r.Role)
		}
		if !strings.HasPrefix(r.Path, "/") || path.Clean(r.Path) != r.Path || r.Path == "/" {
			return nil, fmt.Errorf("path %q is not absolute and clean (like /tenants/a)", r.Path)
		}
		tmpl.URIs = []*url.URL{{Scheme: PathScheme, Opaque: r.Path}}
	}
	if r.Role == RoleNode {
		// A node serves the API and Raft and dials the other nodes.
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range r.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	return sign(tmpl, key, ca.Cert, ca.Key)
}

func sign(tmpl *x509.Certificate, key crypto.Signer, parent *x509.Certificate, parentKey crypto.Signer) (*Pair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Pair{Cert: cert, Key: key}, nil
}

// CertPEM is the certificate in PEM.
func (p *Pair) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Cert.Raw})
}

// KeyPEM is the private key in PKCS #8 PEM.
func (p *Pair) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(p.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles writes certFile and keyFile (the key readable by its owner
// only). Each is written to a temporary name and renamed, so a node that
// reloads at that moment reads the old file or the new one, never half.
func (p *Pair) WriteFiles(certFile, keyFile string) error {
	kp, err := p.KeyPEM()
	if err != nil {
		return err
	}
	if err := writeAtomic(keyFile, kp, 0o600); err != nil {
		return err
	}
	return writeAtomic(certFile, p.CertPEM(), 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// LoadPair reads a certificate and its key from PEM files.
func LoadPair(certFile, keyFile string) (*Pair, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(cb)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	kblk, _ := pem.Decode(kb)
	if kblk == nil {
		return nil, fmt.Errorf("%s: no PEM key", keyFile)
	}
	var key any
	switch kblk.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kblk.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kblk.Bytes)
	default:
		err = fmt.Errorf("unsupported key block %q", kblk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", keyFile)
	}
	return &Pair{Cert: cert, Key: signer}, nil
}

// LoadCA reads dir's CA certificate and key.
func LoadCA(dir string) (*Pair, error) {
	return LoadPair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile))
}

// WriteCA writes the CA into dir as ca.crt and ca.key.
func (p *Pair) WriteCA(dir string) error {
	return p.WriteFiles(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile))
}

// Write writes the pair into dir as NAME.crt and NAME.key.
func (p *Pair) Write(dir, name string) error {
	return p.WriteFiles(CertFile(dir, name), KeyFile(dir, name))
}

// ClusterSetup makes (or keeps) a cluster's certificates in dir: a CA,
// one node certificate per name in nodes valid for hosts, and an "admin"
// client certificate. Files that exist are kept, so a restart reuses them.
func ClusterSetup(dir string, nodes []string, hosts []string) error {
	ca, err := LoadCA(dir)
	if errors.Is(err, os.ErrNotExist) {
		if ca, err = NewCA(Request{}); err != nil {
			return err
		}
		if err := ca.WriteCA(dir); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	for _, name := range nodes {
		if err := issueMissing(ca, dir, Request{Name: name, Role: RoleNode, Hosts: hosts}); err != nil {
			return err
		}
	}
	return issueMissing(ca, dir, Request{Name: "admin", Role: RoleAdmin})
}

func issueMissing(ca *Pair, dir string, r Request) error {
	if _, err := os.Stat(CertFile(dir, r.Name)); err == nil {
		return nil
	}
	p, err := ca.Issue(r)
	if err != nil {
		return err
	}
	return p.Write(dir, r.Name)
}
