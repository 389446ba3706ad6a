package hostmem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func write(t *testing.T, path, s string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
}

func TestReadTakesTheTightestLimit(t *testing.T) {
	const gib = 1 << 30
	dir := t.TempDir()
	old := Root
	Root = filepath.Join(dir, "cg")
	t.Cleanup(func() { Root = old })
	meminfo := filepath.Join(dir, "meminfo")
	write(t, meminfo, "MemTotal:       25165824 kB\nMemFree: 1 kB\n") // 24 GiB
	for _, tc := range []struct {
		name, cgroups string
		files         map[string]string // under Root
		want          uint64
		source        string
	}{
		{"no cgroups file", "", nil, 24 * gib, "MemTotal"},
		{"v2 without a limit", "0::/a\n", map[string]string{"a/memory.max": "max\n"}, 24 * gib, "MemTotal"},
		{"v2 own limit", "0::/a/b\n", map[string]string{"a/b/memory.max": "1073741824\n", "a/memory.max": "max\n"}, gib, "a/b/memory.max"},
		{"v2 parent tighter", "0::/a/b\n", map[string]string{"a/b/memory.max": "4294967296\n", "a/memory.max": "2147483648\n"}, 2 * gib, "a/memory.max"},
		{"v1 memory controller", "4:memory:/p/q\n0::/\n", map[string]string{"memory/p/q/memory.limit_in_bytes": "536870912\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"}, gib / 2, "memory/p/q/memory.limit_in_bytes"},
		{"v1 shared line", "3:cpu,memory:/p\n", map[string]string{"memory/p/memory.limit_in_bytes": "268435456\n"}, gib / 4, "memory/p/memory.limit_in_bytes"},
		{"limit above RAM", "0::/a\n", map[string]string{"a/memory.max": "68719476736\n"}, 24 * gib, "MemTotal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.RemoveAll(Root))
			cgroups := filepath.Join(dir, "nonexistent")
			if tc.cgroups != "" {
				cgroups = filepath.Join(dir, "cgroup")
				write(t, cgroups, tc.cgroups)
			}
			for f, v := range tc.files {
				write(t, filepath.Join(Root, f), v)
			}
			l, err := read(meminfo, cgroups)
			require.NoError(t, err)
			require.Equal(t, tc.want, l.Bytes)
			if tc.source != "MemTotal" {
				tc.source = filepath.Join(Root, tc.source)
			}
			require.Equal(t, tc.source, l.Source)
		})
	}
}

func TestReadThisHost(t *testing.T) {
	l, err := Read()
	if err != nil {
		t.Skip("no /proc/meminfo:", err)
	}
	require.NotZero(t, l.Bytes)
}
