package fuse

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
)

// TestRelatimeThroughMount: with --atime relatime, the first read through
// the mount of a file another client changed moves its access time in the
// cluster: the kernel leaves a FUSE file's atime to the file system.
func TestRelatimeThroughMount(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{Atime: AtimeRelative})
	other := newClient(t, cl.APIAddrs())
	atime := func(name string) time.Time {
		fi, err := other.Stat(name)
		require.NoError(t, err)
		return time.Unix(0, fi.Sys().(*pb.Attr).AtimeNs)
	}
	old, changed := time.Unix(1_500_000_000, 0), time.Unix(1_600_000_000, 0)
	require.NoError(t, other.WriteFile("/f", []byte("changed elsewhere"), 0o644))
	require.NoError(t, other.Chtimes("/f", old, changed)) // atime before mtime
	require.Equal(t, old.UnixNano(), atime("/f").UnixNano())

	got, err := os.ReadFile(filepath.Join(m.Dir(), "f"))
	require.NoError(t, err)
	require.Equal(t, "changed elsewhere", string(got))
	require.Eventually(t, func() bool { return atime("/f").After(changed) }, 20*time.Second, 20*time.Millisecond,
		"the first read after a change moves atime")
}
