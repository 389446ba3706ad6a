package fuse

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestConfinedTokenMount mounts a TLS cluster with a write token confined
// to /tenants/a: the mount's root is that directory (inode 1), nothing
// outside it shows, what the mount makes lands inside, and a file the
// mount holds open after unlinking it stays usable.
func TestConfinedTokenMount(t *testing.T) {
	requireFUSE(t)
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	admin := newClient(t, c.APIAddrs(), client.WithTLS(c.ClientTLS("admin").ClientConfig()))
	require.NoError(t, admin.MkdirAll("/tenants/a/docs", 0o755))
	require.NoError(t, admin.MkdirAll("/tenants/b", 0o755))
	require.NoError(t, admin.WriteFile("/tenants/a/docs/x.txt", []byte("for a"), 0o644))
	require.NoError(t, admin.WriteFile("/tenants/b/secret", []byte("for b"), 0o644))
	require.NoError(t, admin.WriteFile("/top", []byte("for the admin"), 0o644))

	const text = "tenant a's token"
	ctx := context.Background()
	_, err := admin.Do(ctx, &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: authz.TokenHash(text), Role: pb.Role_ROLE_WRITE, Path: "/tenants/a"}}})
	require.NoError(t, err)
	poll(t, 30*time.Second, "every node knows the token", func() bool {
		for _, n := range c.Nodes() {
			if n.FSM().Token(authz.TokenHash(text)) == nil {
				return false
			}
		}
		return true
	})
	ca, err := tlsconf.Load(tlsconf.Files{CA: c.CertFiles("admin").CA}, nil)
	require.NoError(t, err)
	m := mountOn(t, c.APIAddrs(), Options{}, client.WithTLS(ca.ClientConfig()), client.WithToken(text))
	dir := m.Dir()

	var names []string
	within(t, testOpTimeout, "readdir of the root", func() error {
		ents, err := os.ReadDir(dir)
		names = names[:0]
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return err
	})
	require.Equal(t, []string{"docs"}, names, "the root is /tenants/a")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(dir, &st))
	require.EqualValues(t, 1, st.Ino, "the root is inode 1")

	var got []byte
	within(t, testOpTimeout, "read", func() (err error) {
		got, err = os.ReadFile(filepath.Join(dir, "docs", "x.txt"))
		return err
	})
	require.Equal(t, "for a", string(got))
	for _, p := range []string{"tenants", "top", "tenants/b/secret", "b/secret", "docs/../../b/secret"} {
		_, err := os.Stat(filepath.Join(dir, p))
		require.ErrorIs(t, err, os.ErrNotExist, p)
	}

	within(t, testOpTimeout, "create", func() error {
		return os.WriteFile(filepath.Join(dir, "docs", "new.txt"), []byte("made by a"), 0o644)
	})
	within(t, testOpTimeout, "mkdir and rename", func() error {
		if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
			return err
		}
		return os.Rename(filepath.Join(dir, "docs", "new.txt"), filepath.Join(dir, "d", "moved.txt"))
	})
	within(t, testOpTimeout, "fsync", func() error {
		f, err := os.Open(filepath.Join(dir, "d"))
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
	poll(t, 10*time.Second, "the admin sees the file inside /tenants/a", func() bool {
		b, err := admin.ReadFile("/tenants/a/d/moved.txt")
		return err == nil && string(b) == "made by a"
	})

	// An unlinked file held open: fstat, write and read through it.
	within(t, testOpTimeout, "unlinked open file", func() error {
		p := filepath.Join(dir, "tmp")
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := os.Remove(p); err != nil {
			return err
		}
		if _, err := f.Write([]byte("scratch")); err != nil {
			return err
		}
		if _, err := f.Stat(); err != nil {
			return err
		}
		b := make([]byte, 7)
		if _, err := f.ReadAt(b, 0); err != nil || string(b) != "scratch" {
			return err
		}
		return nil
	})

	// Nothing outside changed.
	b, err := admin.ReadFile("/tenants/b/secret")
	require.NoError(t, err)
	require.Equal(t, "for b", string(b))
	ents, err := admin.ReadDir("/")
	require.NoError(t, err)
	require.Len(t, ents, 2, "only /tenants and /top at the real root")
}
