package chaos

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/test/harness"
)

// TestClientReadDirRenameRace reproduces a non-linearizable client.ReadDir:
// it resolves the path to an inode and lists the inode in a second query,
// so a rename that replaces the directory in between makes ReadDir of a
// name that always existed fail with ENOENT. It runs only with
// MEMFS_CLIENT_READDIR=1 until the client lists by path in one query
// (the linearizability workload uses one ReadDirQuery by path meanwhile).
func TestClientReadDirRenameRace(t *testing.T) {
	if os.Getenv("MEMFS_CLIENT_READDIR") != "1" {
		t.Skip("known client issue; set MEMFS_CLIENT_READDIR=1 to check it")
	}
	c := harness.Start(t, harness.Options{Nodes: 3, Seed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := c.Client(ctx, "c0", nil)
	require.NoError(t, err)
	defer cl.Close()
	cc := cl.WithContext(ctx)
	require.NoError(t, cc.Mkdir("/b", 0o755))

	var enoent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil && enoent.Load() == 0 {
			if _, err := cc.ReadDir("/b"); errors.Is(err, fs.ErrNotExist) {
				enoent.Add(1)
			}
		}
	}()
	// /b always exists: each round replaces it with a fresh directory.
	for i := 0; i < 300 && enoent.Load() == 0; i++ {
		require.NoError(t, cc.Mkdir("/a", 0o755))
		require.NoError(t, cc.Rename("/a", "/b"))
	}
	cancel()
	<-done
	require.Zero(t, enoent.Load(), "ReadDir of a directory that always existed failed with ENOENT")
}
