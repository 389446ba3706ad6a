package main

import (
	"crypto/tls"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

// TestServerReloadsCertificateOnSIGHUP runs `memfs server` with TLS and a
// reload interval too long to matter, replaces its certificate files, and
// checks that SIGHUP alone makes it present the new certificate; a
// certificate the CA did not sign is refused and the current one stays.
func TestServerReloadsCertificateOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	dir := t.TempDir()
	require.NoError(t, pki.ClusterSetup(dir, []string{"n1"}, []string{"127.0.0.1"}))
	ca, err := pki.LoadCA(dir)
	require.NoError(t, err)
	ports := freePorts(t, 2)
	out := &syncBuffer{}
	cmd := exec.Command(bin, "server", "--id", "n1", "--ephemeral", "--bootstrap",
		"--raft-addr", ports[0], "--api-addr", ports[1], "--tls-reload-interval", "1h",
		"--ca", filepath.Join(dir, pki.CAFile), "--cert", pki.CertFile(dir, "n1"), "--key", pki.KeyFile(dir, "n1"))
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	probe, err := tlsconf.Load(tlsconf.Files{CA: filepath.Join(dir, pki.CAFile)}, nil)
	require.NoError(t, err)
	serial := func() string {
		cfg := probe.ClientConfig()
		cfg.ServerName, cfg.NextProtos = "127.0.0.1", []string{"h2"}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", ports[1], cfg)
		if err != nil {
			return ""
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	var first string
	require.Eventually(t, func() bool { first = serial(); return first != "" }, 60*time.Second, 50*time.Millisecond, "%s", out)

	// A certificate of another CA: the reload fails, the old one stays.
	other, err := pki.NewCA(pki.Request{Name: "other"})
	require.NoError(t, err)
	bad, err := other.Issue(pki.Request{Name: "n1", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
	require.NoError(t, err)
	require.NoError(t, bad.Write(dir, "n1"))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "TLS reload failed") }, 30*time.Second, 50*time.Millisecond, "%s", out)
	require.Equal(t, first, serial())

	good, err := ca.Issue(pki.Request{Name: "n1", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
	require.NoError(t, err)
	require.NoError(t, good.Write(dir, "n1"))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return serial() == good.Cert.SerialNumber.String() }, 30*time.Second, 50*time.Millisecond, "%s", out)
}
