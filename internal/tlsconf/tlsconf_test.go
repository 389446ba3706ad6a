package tlsconf_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

func setup(t *testing.T) (string, *pki.Pair, tlsconf.Files) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.Request{})
	require.NoError(t, err)
	require.NoError(t, ca.WriteCA(dir))
	p, err := ca.Issue(pki.Request{Name: "n1", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
	require.NoError(t, err)
	require.NoError(t, p.Write(dir, "n1"))
	return dir, ca, tlsconf.Files{CA: filepath.Join(dir, pki.CAFile), Cert: pki.CertFile(dir, "n1"), Key: pki.KeyFile(dir, "n1")}
}

func TestLoadRefusesWhatCannotWork(t *testing.T) {
	dir, _, files := setup(t)
	other, err := pki.NewCA(pki.Request{})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other.crt"), other.CertPEM(), 0o644))
	garbage := filepath.Join(dir, "garbage.crt")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM at all"), 0o644))
	cases := []struct {
		name  string
		files tlsconf.Files
		want  string
	}{
		{"no CA", tlsconf.Files{Cert: files.Cert, Key: files.Key}, "no CA file"},
		{"certificate without key", tlsconf.Files{CA: files.CA, Cert: files.Cert}, "needs its key"},
		{"CA file without certificates", tlsconf.Files{CA: garbage}, "holds no PEM certificate"},
		{"certificate of another CA", tlsconf.Files{CA: filepath.Join(dir, "other.crt"), Cert: files.Cert, Key: files.Key}, "is not valid under"},
		{"missing file", tlsconf.Files{CA: filepath.Join(dir, "none.crt")}, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tlsconf.Load(tc.files, nil)
			require.ErrorContains(t, err, tc.want)
		})
	}
	src, err := tlsconf.Load(files, nil)
	require.NoError(t, err)
	require.True(t, tlsconf.HasRole(src.Certificate(), tlsconf.NodeRole))
}

func TestWatchReloadsChangedFilesAndKeepsTheOldOnError(t *testing.T) {
	dir, ca, files := setup(t)
	src, err := tlsconf.Load(files, nil)
	require.NoError(t, err)
	first := src.Certificate().SerialNumber
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Watch(ctx, 10*time.Millisecond)

	// A broken certificate file keeps the current certificate.
	require.NoError(t, os.WriteFile(files.Cert, []byte("truncated"), 0o644))
	require.Never(t, func() bool { return src.Certificate().SerialNumber.Cmp(first) != 0 },
		300*time.Millisecond, 10*time.Millisecond)

	p, err := ca.Issue(pki.Request{Name: "n1", Role: pki.RoleNode, Hosts: []string{"127.0.0.1"}})
	require.NoError(t, err)
	require.NoError(t, p.Write(dir, "n1"))
	require.Eventually(t, func() bool { return src.Certificate().SerialNumber.Cmp(p.Cert.SerialNumber) == 0 },
		10*time.Second, 10*time.Millisecond)
}
