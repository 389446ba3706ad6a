package pageout

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// residentKiB reads the Rss of this process's mapping of path from
// /proc/self/smaps.
func residentKiB(t *testing.T, path string) int {
	b, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(b))
	in, total := false, 0
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 6 && strings.Contains(f[0], "-") {
			in = strings.Join(f[5:], " ") == path
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			n, err := strconv.Atoi(strings.Fields(line)[1])
			require.NoError(t, err)
			total += n
		}
	}
	return total
}

func TestFileReclaimsAMappingAndKeepsItsBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log file.db") // a space, as paths may have
	data := bytes.Repeat([]byte("memoryfs"), 8<<20/8)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Sync()) // clean, as bbolt's fsynced pages are
	m, err := syscall.Mmap(int(f.Fd()), 0, len(data), syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	defer syscall.Munmap(m)
	require.Equal(t, data, m) // touches every page
	require.GreaterOrEqual(t, residentKiB(t, path), 7<<10)

	advised, err := File(path)
	require.NoError(t, err)
	require.Equal(t, int64(len(data)), advised)
	// Reclaim is best effort: some pages stay (0.6 MiB of 8 here on a
	// quiet machine, 2.3 MiB under the race detector or load: a CPU's
	// batch of newly used pages, a large folio the kernel will not take).
	require.Eventually(t, func() bool {
		_, err := File(path)
		return err == nil && residentKiB(t, path) <= 4<<10
	}, 10*time.Second, 20*time.Millisecond, "most pages left the process")
	require.Equal(t, data, m, "and read back the same")

	advised, err = File(filepath.Join(t.TempDir(), "not mapped"))
	require.NoError(t, err)
	require.Zero(t, advised)
}

func TestMappingOf(t *testing.T) {
	for _, c := range []struct {
		line, path string
		start, end uintptr
		ok         bool
	}{
		{"7f00a000-7f00c000 r--s 00000000 fd:01 1234 /data/raft.db", "/data/raft.db", 0x7f00a000, 0x7f00c000, true},
		{"7f00a000-7f00c000 r--s 00000000 fd:01 1234 /data/my raft.db", "/data/my raft.db", 0x7f00a000, 0x7f00c000, true},
		{"7f00a000-7f00c000 r--s 00000000 fd:01 1234 /data/raft.db.bak", "/data/raft.db", 0, 0, false},
		{"7f00a000-7f00c000 rw-p 00000000 00:00 0", "/data/raft.db", 0, 0, false},
		{"zz-7f00c000 r--s 00000000 fd:01 1234 /data/raft.db", "/data/raft.db", 0, 0, false},
		{"7f00c000-7f00a000 r--s 00000000 fd:01 1234 /data/raft.db", "/data/raft.db", 0, 0, false},
	} {
		s, e, ok := mappingOf([]byte(c.line), c.path)
		require.Equal(t, c.ok, ok, c.line)
		require.Equal(t, c.start, s, c.line)
		require.Equal(t, c.end, e, c.line)
	}
}
