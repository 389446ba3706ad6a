// Package tlsconf turns a CA, certificate and key in PEM files into TLS 1.3
// configurations for the node's API, its Raft transport, its connections
// to other nodes, and for clients, and reloads the files when they change
// (SIGHUP or a poll), so certificates rotate without a restart.
//
// It never decides what a verified peer may do (package server's
// authorization does); it only checks chains, and for node-to-node links
// that the peer carries the node role.
package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// NodeRole is the OrganizationalUnit of a node certificate.
const NodeRole = "node"

// Files names the PEM files. CA may hold several certificates (during a
// CA rotation, the old and the new).
type Files struct {
	CA, Cert, Key string
}

// Source holds the current certificate and CA pool and swaps them in when
// the files change. Configurations it returns read the current ones on
// every handshake.
type Source struct {
	files Files
	cur   atomic.Pointer[bundle]
	log   *slog.Logger
}

type bundle struct {
	cert  *tls.Certificate // nil when Files has no Cert (a CA-only client)
	roots *x509.CertPool
	stamp string // sizes and mtimes of the files, to notice a change
}

// Load reads the files. CA is required; Cert and Key go together.
func Load(files Files, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Source{files: files, log: log}
	b, err := s.read()
	if err != nil {
		return nil, err
	}
	s.cur.Store(b)
	return s, nil
}

func (s *Source) stamp() string {
	out := ""
	for _, f := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			out += f + ":missing;"
			continue
		}
		out += fmt.Sprintf("%s:%d:%d;", f, fi.Size(), fi.ModTime().UnixNano())
	}
	return out
}

func (s *Source) read() (*bundle, error) {
	if s.files.CA == "" {
		return nil, errors.New("no CA file")
	}
	if (s.files.Cert == "") != (s.files.Key == "") {
		return nil, errors.New("a certificate needs its key and a key its certificate")
	}
	stamp := s.stamp()
	pemCA, err := os.ReadFile(s.files.CA)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemCA) {
		return nil, fmt.Errorf("%s holds no PEM certificate", s.files.CA)
	}
	b := &bundle{roots: roots, stamp: stamp}
	if s.files.Cert != "" {
		c, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
		if err != nil {
			return nil, fmt.Errorf("load certificate: %w", err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%s is not valid under %s: %w", s.files.Cert, s.files.CA, err)
		}
		b.cert = &c
	}
	return b, nil
}

// Reload reads the files again. On an error the current certificate stays
// in use and the error says why.
func (s *Source) Reload() error {
	b, err := s.read()
	if err != nil {
		s.log.Error("TLS reload failed; keeping the current certificate", "err", err)
		return err
	}
	s.cur.Store(b)
	if b.cert != nil {
		s.log.Info("TLS certificate loaded", "subject", b.cert.Leaf.Subject.String(),
			"serial", b.cert.Leaf.SerialNumber.String(), "not_after", b.cert.Leaf.NotAfter)
	}
	return nil
}

// Watch reloads whenever the files' sizes or times change, polling every
// interval until ctx ends. Renaming a new file into place (as pki and
// cert-manager do) is seen at the next poll.
func (s *Source) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if st := s.stamp(); st != s.cur.Load().stamp {
			_ = s.Reload()
			if b := s.cur.Load(); b.stamp != st {
				// A failed read keeps the old stamp: remember this one
				// so a broken file is not retried every poll.
				nb := *b
				nb.stamp = st
				s.cur.Store(&nb)
			}
		}
	}
}

// Certificate is the current certificate's leaf (nil without one).
func (s *Source) Certificate() *x509.Certificate {
	if c := s.cur.Load().cert; c != nil {
		return c.Leaf
	}
	return nil
}

func (s *Source) getCert(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cur.Load().cert; c != nil {
		return c, nil
	}
	return nil, errors.New("no certificate configured")
}

func (s *Source) getClientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := s.cur.Load().cert; c != nil {
		return c, nil
	}
	return &tls.Certificate{}, nil // none: the server decides
}

// ServerConfig serves the API: clients may present a certificate of the
// cluster's CA (verified) or none (they then need a token).
func (s *Source) ServerConfig() *tls.Config {
	c := s.serverConfig(tls.VerifyClientCertIfGiven)
	c.NextProtos = []string{"h2"} // gRPC requires ALPN
	return c
}

// PeerServerConfig serves Raft: only nodes of the cluster's CA get in.
func (s *Source) PeerServerConfig() *tls.Config {
	c := s.serverConfig(tls.RequireAndVerifyClientCert)
	c.VerifyConnection = func(cs tls.ConnectionState) error { return requireNode(cs.PeerCertificates) }
	return c
}

func (s *Source) serverConfig(auth tls.ClientAuthType) *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS13}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		// A fresh config per handshake so a reloaded CA pool applies.
		b := s.cur.Load()
		return &tls.Config{
			MinVersion:       tls.VersionTLS13,
			GetCertificate:   s.getCert,
			ClientAuth:       auth,
			ClientCAs:        b.roots,
			VerifyConnection: base.VerifyConnection,
			NextProtos:       base.NextProtos,
		}, nil
	}
	base.GetCertificate = s.getCert
	return base
}

// PeerClientConfig dials another node (Raft, forwarding, block sync): it
// presents the node's certificate and accepts a peer whose chain leads to
// the cluster's CA and that carries the node role. Host names are not
// checked: membership, not an address, makes a node (a node is known by
// the address Raft recorded, which a certificate made before it joined
// need not name).
func (s *Source) PeerClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: s.getClientCert,
		// Verification is done below against the current pool, which
		// crypto/tls cannot take per handshake on the client side.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := s.verifyChain(cs.PeerCertificates, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
			return requireNode(cs.PeerCertificates)
		},
	}
}

// ClientConfig dials the API as a client: the server's certificate must
// lead to the CA and name the host dialled (crypto/tls checks it against
// the ServerName gRPC sets from the address).
func (s *Source) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: s.getClientCert,
		InsecureSkipVerify:   true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			b := s.cur.Load()
			opts := x509.VerifyOptions{Roots: b.roots, DNSName: cs.ServerName,
				Intermediates: pool(cs.PeerCertificates[1:]), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}
}

func (s *Source) verifyChain(certs []*x509.Certificate, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("peer sent no certificate")
	}
	b := s.cur.Load()
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: b.roots, Intermediates: pool(certs[1:]),
		KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func requireNode(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("peer sent no certificate")
	}
	if !HasRole(certs[0], NodeRole) {
		return fmt.Errorf("peer %q is not a node certificate (organizational unit %q)",
			certs[0].Subject.CommonName, certs[0].Subject.OrganizationalUnit)
	}
	return nil
}

// HasRole reports whether cert names role in its OrganizationalUnit.
func HasRole(cert *x509.Certificate, role string) bool {
	return slices.Contains(cert.Subject.OrganizationalUnit, role)
}
