package chaos

import (
	"context"
	"errors"
	"io/fs"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/test/harness"
)

// TestClientReadDirRenameRace checks that client.ReadDir is atomic against
// a rename over the directory it lists. It used to resolve the path to an
// inode and list the inode in a second query, so a rename that replaced the
// directory in between made ReadDir of a name that always existed fail with
// ENOENT; this test reproduced that in well under a second.
func TestClientReadDirRenameRace(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: 3, Seed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	// /b always exists: each round replaces it with a fresh directory. The
	// old client failed within a few dozen rounds; a loaded machine gets
	// through fewer rounds, hence the time bound as well.
	stop := time.Now().Add(10 * time.Second)
	for i := 0; i < 300 && enoent.Load() == 0 && time.Now().Before(stop); i++ {
		require.NoError(t, cc.Mkdir("/a", 0o755))
		require.NoError(t, cc.Rename("/a", "/b"))
	}
	cancel()
	<-done
	require.Zero(t, enoent.Load(), "ReadDir of a directory that always existed failed with ENOENT")
}
