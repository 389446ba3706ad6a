package fuse

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memoryfs/memfs/internal/promstat"
)

// TestMountMetrics checks that a mount made with Options.Metrics counts
// and times what programs do through it, errors by errno, and reports
// its own counters.
func TestMountMetrics(t *testing.T) {
	c := startCluster(t, 3)
	reg := prometheus.NewRegistry()
	m := mountOn(t, c.APIAddrs(), Options{Metrics: reg})
	dir := m.Dir()

	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	p := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(p, data, 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	require.NoError(t, unix.Fsync(int(f.Fd())))
	back := make([]byte, len(data))
	_, err = f.ReadAt(back, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, data, back)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	for range 3 {
		_, err := os.Stat(filepath.Join(dir, "d"))
		require.NoError(t, err)
	}
	_, err = os.Stat(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)

	s, err := promstat.Take(reg)
	require.NoError(t, err)
	ops := s.Values("memfs_mount_ops_total", "op")
	// (Reads may all be the kernel's page cache's: not required.)
	for _, op := range []string{"lookup", "create", "write", "flush", "mkdir"} {
		require.Positive(t, ops[op], "operation %s counted: %v", op, ops)
	}
	lat := s.Histograms("memfs_mount_op_duration_seconds", "op")
	require.Equal(t, ops["write"], lat["write"].Count, "every counted write is timed")
	require.Positive(t, lat["write"].Sum)
	require.Positive(t, s.Values("memfs_mount_op_errors_total", "errno")["ENOENT"], "the missing file's lookup")
	hits := s.Values("memfs_mount_meta_cache_hits_total", "")[""]
	misses := s.Values("memfs_mount_meta_cache_misses_total", "")[""]
	require.Positive(t, hits+misses)
	if testCaps {
		require.Positive(t, hits, "a mount with capabilities answers repeated stats itself")
	}
	for _, name := range []string{"memfs_mount_journal_depth", "memfs_mount_capability_recalls_total",
		"memfs_mount_write_behind_unsent_bytes", "memfs_mount_journal_flush_duration_seconds"} {
		require.Contains(t, s.Families, name)
	}
	if testCaps && !testSync {
		// Buffered metadata: syncfs sends what the journal holds, in
		// timed batches, and leaves it empty.
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Syncfs(fd))
		require.NoError(t, unix.Close(fd))
		require.Eventually(t, func() bool {
			s, err := promstat.Take(reg)
			require.NoError(t, err)
			flush := s.Families["memfs_mount_journal_flush_duration_seconds"].GetMetric()[0].GetSummary()
			return s.Values("memfs_mount_journal_depth", "")[""] == 0 && flush.GetSampleCount() > 0 && flush.GetSampleSum() > 0
		}, 30*time.Second, 50*time.Millisecond, "the create and mkdir went in timed batches, and nothing is left")
	}
}
