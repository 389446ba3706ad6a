package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func randomData(n int, seed ...byte) []byte {
	var key [32]byte
	copy(key[copy(key[:], seed):], []byte{6, 6})
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// TestMemoryBudgetEndToEnd runs a real cluster with a 1 MiB budget: statfs
// reports it as the size, a write past it fails with ENOSPC through the
// client and the CLI (exit 1, readable message) without changing the
// file, and the same writes succeed once space is freed.
func TestMemoryBudgetEndToEnd(t *testing.T) {
	const budget = 1 << 20
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral(),
		servertest.WithNodeConfig(func(_ int, c *server.Config) { c.MemoryLimit = budget }))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(ctx, cluster.APIAddrs())
	require.NoError(t, err)
	defer c.Close()

	st, err := c.Statfs(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(budget), st.TotalBytes)
	require.Equal(t, uint64(budget), st.FreeBytes)

	orig := randomData(512<<10, 1)
	require.NoError(t, c.WriteFile("/a", orig, 0o644))
	f, err := c.OpenFile("/a", os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	more := randomData(768<<10, 2)
	_, err = f.WriteAt(more, 512<<10) // 512 KiB + 768 KiB > 1 MiB
	require.ErrorIs(t, err, syscall.ENOSPC)
	got, err := c.ReadFile("/a")
	require.NoError(t, err)
	require.Equal(t, orig, got, "a refused write leaves the file as it was")
	st, err = c.Statfs(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(budget-512<<10), st.FreeBytes)

	// The CLI: a put that does not fit fails with exit status 1.
	m := cli{t: t, bin: memfsBinary(t), cluster: strings.Join(cluster.APIAddrs(), ",")}
	local := filepath.Join(t.TempDir(), "more")
	require.NoError(t, os.WriteFile(local, more, 0o644))
	_, errOut, code := m.run("", "put", local, "/b")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "no space left on device")
	require.NotContains(t, errOut, "rpc error")
	require.Equal(t, string(orig), m.ok("cat", "/a"))

	// Freeing space makes the same put succeed (an open file's blocks
	// stay until its last handle closes).
	require.NoError(t, f.Close())
	m.ok("rm", "/a")
	m.ok("put", local, "/b")
	require.Equal(t, string(more), m.ok("cat", "/b"))

	// Identical data costs nothing: a second copy of /b fits a nearly full
	// budget, and removing one copy frees nothing.
	require.NoError(t, c.WriteFile("/a", orig[:128<<10], 0o644)) // 896 KiB used
	require.NoError(t, c.WriteFile("/b2", more, 0o644))
	g, err := c.OpenFile("/a", os.O_RDWR, 0)
	require.NoError(t, err)
	defer g.Close()
	_, err = g.WriteAt(orig[128<<10:], 128<<10)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NoError(t, c.Remove("/b"))
	_, err = g.WriteAt(orig[128<<10:], 128<<10)
	require.True(t, errors.Is(err, syscall.ENOSPC), "/b2 still holds the blocks: %v", err)
	require.NoError(t, c.Remove("/b2"))
	_, err = g.WriteAt(orig[128<<10:], 128<<10)
	require.NoError(t, err)
	got, err = c.ReadFile("/a")
	require.NoError(t, err)
	require.Equal(t, orig, got)
}
