package fuse

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestReadRoleMount mounts a TLS cluster as a client with the read role:
// the tree reads as usual, and every change is refused with EACCES and
// leaves the tree as it was.
func TestReadRoleMount(t *testing.T) {
	requireFUSE(t)
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	admin := newClient(t, c.APIAddrs(), client.WithTLS(c.ClientTLS("admin").ClientConfig()))
	require.NoError(t, admin.MkdirAll("/docs", 0o755))
	require.NoError(t, admin.WriteFile("/docs/a.txt", []byte("hello"), 0o644))

	dir := t.TempDir()
	p, err := c.CA().Issue(pki.Request{Name: "reader", Role: pki.RoleRead})
	require.NoError(t, err)
	require.NoError(t, p.Write(dir, "reader"))
	src, err := tlsconf.Load(tlsconf.Files{CA: c.CertFiles("admin").CA, Cert: pki.CertFile(dir, "reader"), Key: pki.KeyFile(dir, "reader")}, nil)
	require.NoError(t, err)
	copts := []client.Option{client.WithTLS(src.ClientConfig())}
	if testCaps {
		copts = append(copts, client.WithCaps())
	}
	reader := newClient(t, c.APIAddrs(), copts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Mount(ctx, reader, t.TempDir(), Options{OpTimeout: testOpTimeout, Binding: testBinding, Sync: testSync})
	require.NoError(t, err)
	t.Cleanup(func() {
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Unmount(uctx); err != nil {
			_ = exec.Command(Fusermount, "-uz", m.Dir()).Run()
		}
	})
	pollProbeAt(t, filepath.Join(m.Dir(), "docs", "a.txt"), false)

	var got []byte
	within(t, testOpTimeout, "read", func() (err error) {
		got, err = os.ReadFile(filepath.Join(m.Dir(), "docs", "a.txt"))
		return err
	})
	require.Equal(t, "hello", string(got))
	var ents []os.DirEntry
	within(t, testOpTimeout, "readdir", func() (err error) {
		ents, err = os.ReadDir(filepath.Join(m.Dir(), "docs"))
		return err
	})
	require.Len(t, ents, 1)

	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"create", func() error { return os.WriteFile(filepath.Join(m.Dir(), "docs", "b.txt"), []byte("x"), 0o644) }},
		{"append", func() error {
			f, err := os.OpenFile(filepath.Join(m.Dir(), "docs", "a.txt"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			_, werr := f.Write([]byte("more"))
			return errors.Join(werr, f.Close())
		}},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(m.Dir(), "new"), 0o755) }},
		{"unlink", func() error { return os.Remove(filepath.Join(m.Dir(), "docs", "a.txt")) }},
		{"rename", func() error {
			return os.Rename(filepath.Join(m.Dir(), "docs", "a.txt"), filepath.Join(m.Dir(), "docs", "c.txt"))
		}},
		{"chmod", func() error { return os.Chmod(filepath.Join(m.Dir(), "docs", "a.txt"), 0o600) }},
	} {
		within(t, testOpTimeout, op.name, func() error {
			if err := op.do(); !errors.Is(err, syscall.EACCES) {
				return fmt.Errorf("want EACCES, got %v", err)
			}
			return nil
		})
	}
	got, err = admin.ReadFile("/docs/a.txt")
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	names, err := admin.ReadDir("/docs")
	require.NoError(t, err)
	require.Len(t, names, 1)
	st, err := admin.Stat("/docs/a.txt")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), st.Mode().Perm())
}
