package pki_test

import (
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/pki"
)

func TestIssueRolesKeysAndSANs(t *testing.T) {
	for _, kt := range []string{pki.Ed25519, pki.ECDSA} {
		t.Run(kt, func(t *testing.T) {
			dir := t.TempDir()
			ca, err := pki.NewCA(pki.Request{KeyType: kt})
			require.NoError(t, err)
			require.NoError(t, ca.WriteCA(dir))
			back, err := pki.LoadCA(dir)
			require.NoError(t, err)
			require.Equal(t, ca.Cert.Raw, back.Cert.Raw)
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)

			node, err := back.Issue(pki.Request{Name: "n1", Role: pki.RoleNode, Hosts: []string{"10.0.0.1", "node1.example"}, KeyType: kt})
			require.NoError(t, err)
			_, err = node.Cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "node1.example", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			require.NoError(t, err)
			_, err = node.Cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			require.NoError(t, err)
			require.Equal(t, []string{pki.RoleNode}, node.Cert.Subject.OrganizationalUnit)

			cl, err := back.Issue(pki.Request{Name: "alice", Role: pki.RoleWrite, KeyType: kt})
			require.NoError(t, err)
			_, err = cl.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			require.Error(t, err, "a client certificate cannot serve")
			require.NoError(t, cl.Write(dir, "alice"))
			fi, err := os.Stat(pki.KeyFile(dir, "alice"))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
			got, err := pki.LoadPair(pki.CertFile(dir, "alice"), pki.KeyFile(dir, "alice"))
			require.NoError(t, err)
			require.Equal(t, cl.Cert.Raw, got.Cert.Raw)
		})
	}
}

func TestIssueRefusesBadRequests(t *testing.T) {
	ca, err := pki.NewCA(pki.Request{})
	require.NoError(t, err)
	_, err = ca.Issue(pki.Request{Name: "x", Role: "root"})
	require.ErrorContains(t, err, "unknown role")
	_, err = ca.Issue(pki.Request{Role: pki.RoleRead})
	require.ErrorContains(t, err, "name is empty")
	_, err = ca.Issue(pki.Request{Name: "x", Role: pki.RoleRead, KeyType: "rsa"})
	require.ErrorContains(t, err, "unknown key type")
	old, err := ca.Issue(pki.Request{Name: "x", Role: pki.RoleRead, NotBefore: time.Now().Add(-48 * time.Hour), TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, old.Cert.NotAfter.Before(time.Now()), "tests make expired certificates this way")
}

func TestClusterSetupKeepsExistingFiles(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, pki.ClusterSetup(dir, []string{"n1", "n2"}, []string{"127.0.0.1"}))
	before, err := os.ReadFile(pki.CertFile(dir, "n1"))
	require.NoError(t, err)
	require.NoError(t, pki.ClusterSetup(dir, []string{"n1", "n2", "n3"}, []string{"127.0.0.1"}))
	after, err := os.ReadFile(pki.CertFile(dir, "n1"))
	require.NoError(t, err)
	require.Equal(t, before, after)
	for _, f := range []string{pki.CertFile(dir, "n3"), pki.CertFile(dir, "admin")} {
		_, err := os.Stat(f)
		require.NoError(t, err)
	}
}
