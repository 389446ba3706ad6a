package fuse

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMountRecoversWhenClusterReturns stops every node, sees an operation
// fail with EIO, brings every node back from its data dir (on the same
// addresses) and expects the same mount to work again without a remount:
// the files written before are there, new ones can be made and read.
func TestMountRecoversWhenClusterReturns(t *testing.T) {
	cl := startCluster(t, 3)
	const opTimeout = 3 * time.Second
	// Synchronous: a buffering mount answers from the state its capabilities
	// guarantee while they are trusted, with the cluster gone too, and
	// reports what it lost at fsync (fsops.TestBufferedLossReported).
	m := mountOn(t, cl.APIAddrs(), Options{OpTimeout: opTimeout, Sync: true})
	before := filepath.Join(m.Dir(), "before")
	require.NoError(t, os.WriteFile(before, []byte("written before the outage"), 0o644))

	for i := range cl.Size() {
		cl.Kill(i)
	}
	var statErr error
	within(t, opTimeout+20*time.Second, "stat while down", func() error {
		_, statErr = os.Stat(filepath.Join(m.Dir(), "never-seen"))
		return nil
	})
	require.ErrorIs(t, statErr, syscall.EIO)

	for i := range cl.Size() {
		cl.Restart(i)
	}
	cl.WaitLeader(30 * time.Second)

	// The first operations may still meet the election: retry for a while,
	// each one bounded by the mount's own timeout.
	after := filepath.Join(m.Dir(), "after")
	poll(t, 60*time.Second, "a write through the mount after the restart", func() bool {
		var err error
		within(t, opTimeout+20*time.Second, "write after", func() error {
			err = os.WriteFile(after, []byte("written after"), 0o644)
			return nil
		})
		return err == nil
	})
	var got [2][]byte
	var errs [3]error
	within(t, opTimeout+20*time.Second, "read back", func() error {
		got[0], errs[0] = os.ReadFile(before)
		got[1], errs[1] = os.ReadFile(after)
		errs[2] = os.Mkdir(filepath.Join(m.Dir(), "dir-after"), 0o755)
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, "written before the outage", string(got[0]))
	require.Equal(t, "written after", string(got[1]))
}
