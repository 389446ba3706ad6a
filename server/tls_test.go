package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

// tlsClient connects the client library with the certificate name of the
// cluster's directory; its source follows file changes.
func tlsClient(t *testing.T, c *servertest.Cluster, name string) (*client.Client, *tlsconf.Source) {
	t.Helper()
	src := c.ClientTLS(name)
	cl, err := client.New(context.Background(), c.APIAddrs(), client.WithTLS(src.ClientConfig()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl, src
}

// handshake dials addr with cfg and returns the server's leaf certificate.
func handshake(addr string, cfg *tls.Config) (*x509.Certificate, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// TLS 1.3: the server checks the client's certificate after the
	// client's handshake ends; a refusal arrives as an alert on read.
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// issue writes a certificate of ca into dir and returns its files.
func issue(t *testing.T, ca *pki.Pair, dir, caFile string, r pki.Request) tlsconf.Files {
	t.Helper()
	p, err := ca.Issue(r)
	require.NoError(t, err)
	require.NoError(t, p.Write(dir, r.Name))
	return tlsconf.Files{CA: caFile, Cert: pki.CertFile(dir, r.Name), Key: pki.KeyFile(dir, r.Name)}
}

func loadTLS(t *testing.T, f tlsconf.Files) *tlsconf.Source {
	t.Helper()
	s, err := tlsconf.Load(f, nil)
	require.NoError(t, err)
	return s
}

func TestTLSClusterServesAndRefusesStrangers(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	cl, _ := tlsClient(t, c, "admin")
	require.NoError(t, cl.WriteFile("/hello", []byte("over TLS"), 0o644))
	got, err := cl.ReadFile("/hello")
	require.NoError(t, err)
	require.Equal(t, "over TLS", string(got))

	// Another CA's certificates, and a client certificate of the right
	// CA where a node's is needed.
	other, err := pki.NewCA(pki.Request{Name: "stranger CA"})
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, other.WriteCA(dir))
	caFile := filepath.Join(c.CertDir(), pki.CAFile)
	strangerNode := loadTLS(t, issue(t, other, dir, filepath.Join(dir, pki.CAFile),
		pki.Request{Name: "rogue", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}}))
	writer := loadTLS(t, issue(t, c.CA(), dir, caFile, pki.Request{Name: "writer", Role: pki.RoleWrite}))
	trusting := loadTLS(t, tlsconf.Files{CA: caFile})
	expiredPair, err := c.CA().Issue(pki.Request{Name: "expired", Role: pki.RoleAdmin,
		NotBefore: time.Now().Add(-48 * time.Hour), TTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, expiredPair.Write(dir, "expired"))
	expired := trusting.ClientConfig()
	expired.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &tls.Certificate{Certificate: [][]byte{expiredPair.Cert.Raw}, PrivateKey: expiredPair.Key}, nil
	}

	n := c.Node(1)
	cases := []struct {
		name string
		addr string
		cfg  *tls.Config
		ok   bool
	}{
		{"raft: node of the cluster", n.RaftAddr(), c.NodeTLS("n9").PeerClientConfig(), true},
		{"raft: node of another CA", n.RaftAddr(), strangerNode.PeerClientConfig(), false},
		{"raft: client certificate of the cluster", n.RaftAddr(), writer.PeerClientConfig(), false},
		{"raft: no certificate", n.RaftAddr(), trusting.PeerClientConfig(), false},
		{"api: client of the cluster", n.APIAddr(), writer.ClientConfig(), true},
		{"api: no certificate (token clients)", n.APIAddr(), trusting.ClientConfig(), true},
		{"api: certificate of another CA", n.APIAddr(), strangerNode.ClientConfig(), false},
		{"api: expired certificate of the cluster", n.APIAddr(), expired, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg.Clone()
			cfg.ServerName = "127.0.0.1"
			cfg.NextProtos = []string{"h2"}
			leaf, err := handshake(tc.addr, cfg)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.True(t, tlsconf.HasRole(leaf, tlsconf.NodeRole))
		})
	}

	// A node that does not trust the cluster's nodes cannot be served.
	_, err = handshake(n.APIAddr(), &tls.Config{ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	require.Error(t, err, "the system roots do not know the cluster's CA")

	// Plaintext gRPC gets nothing.
	conn, err := grpc.NewClient(n.APIAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = pb.NewMemFSClient(conn).Status(ctx, &pb.StatusRequest{Version: pb.Version})
	require.Error(t, err)

	// Garbage on the Raft port closes the connection; the cluster goes on.
	raw, err := net.Dial("tcp", n.RaftAddr())
	require.NoError(t, err)
	_, _ = raw.Write([]byte("\x00\x01garbage that is no TLS record\r\n\r\n"))
	_ = raw.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, err = raw.Read(make([]byte, 64))
	require.Error(t, err)
	_ = raw.Close()
	require.NoError(t, cl.WriteFile("/after", []byte("still here"), 0o644))
}

// TestTLSRotationUnderWriteLoad rotates every certificate of a live
// cluster to a new CA while clients write, by rewriting the files (the
// nodes poll them, as `memfs server` does besides SIGHUP): first the CA
// file gains the new CA, then every node and client certificate is
// replaced by one of the new CA, then the old CA goes. A restarted node
// joins with the new certificates only. No write fails.
func TestTLSRotationUnderWriteLoad(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	dir := c.CertDir()
	caFile := filepath.Join(dir, pki.CAFile)
	oldCA, err := os.ReadFile(caFile)
	require.NoError(t, err)

	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		written atomic.Int64
		failed  = make(chan error, 16)
	)
	for w := range 4 {
		cl, _ := tlsClient(t, c, "admin")
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				name := fmt.Sprintf("/w%d-%d", w, i)
				if err := cl.WriteFile(name, []byte(name), 0o644); err != nil {
					failed <- fmt.Errorf("%s: %w", name, err)
					return
				}
				written.Add(1)
			}
		})
	}
	progress := func(more int64) {
		target := written.Load() + more
		require.Eventually(t, func() bool { return written.Load() >= target || len(failed) > 0 },
			60*time.Second, 20*time.Millisecond)
		require.Empty(t, failed)
	}
	progress(20)

	newCA, err := pki.NewCA(pki.Request{Name: "memfs CA 2", KeyType: pki.ECDSA})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(caFile+".tmp", append(append([]byte{}, oldCA...), newCA.CertPEM()...), 0o644))
	require.NoError(t, os.Rename(caFile+".tmp", caFile))
	progress(20)

	for _, name := range []string{"n1", "n2", "n3"} {
		issue(t, newCA, dir, caFile, pki.Request{Name: name, Role: pki.RoleNode, Hosts: []string{"127.0.0.1", "localhost"}})
	}
	issue(t, newCA, dir, caFile, pki.Request{Name: "admin", Role: pki.RoleAdmin})
	// Every node presents a certificate of the new CA, on both ports.
	probe := loadTLS(t, issue(t, newCA, t.TempDir(), caFile, pki.Request{Name: "probe", Role: pki.RoleNode}))
	for _, n := range c.Nodes() {
		for _, addr := range []string{n.RaftAddr(), n.APIAddr()} {
			require.Eventually(t, func() bool {
				cfg := probe.PeerClientConfig()
				cfg.NextProtos = []string{"h2"}
				leaf, err := handshake(addr, cfg)
				return err == nil && leaf.Issuer.CommonName == "memfs CA 2"
			}, 30*time.Second, 50*time.Millisecond, "node %s at %s", n.ID(), addr)
		}
	}
	progress(20)

	require.NoError(t, os.WriteFile(caFile+".tmp", newCA.CertPEM(), 0o644))
	require.NoError(t, os.Rename(caFile+".tmp", caFile))
	// The old CA is gone: a node certificate it signs gets in nowhere.
	oldDir := t.TempDir()
	oldCAFile := filepath.Join(oldDir, pki.CAFile)
	require.NoError(t, os.WriteFile(oldCAFile, oldCA, 0o644))
	stale := loadTLS(t, issue(t, c.CA(), oldDir, oldCAFile, pki.Request{Name: "stale", Role: pki.RoleNode}))
	staleCfg := stale.PeerClientConfig()
	staleCfg.InsecureSkipVerify, staleCfg.VerifyConnection = true, nil // only the server's verdict matters here
	require.Eventually(t, func() bool {
		_, err := handshake(c.Node(0).RaftAddr(), staleCfg)
		return err != nil
	}, 30*time.Second, 50*time.Millisecond)
	progress(20)

	// A restarted follower's connections are all new: it and the others
	// must accept each other under the new CA alone.
	leader := c.WaitLeader(30 * time.Second)
	victim := (c.Index(leader) + 1) % 3
	c.Kill(victim)
	progress(20)
	c.Restart(victim)
	progress(20)
	stop.Store(true)
	wg.Wait()
	require.Empty(t, failed)

	// The restarted node caught up, over Raft under the new CA.
	lead := c.WaitLeader(30 * time.Second)
	c.WaitApplied(lead.AppliedIndex(), 60*time.Second)
	t.Logf("%d writes, none failed", written.Load())
}
