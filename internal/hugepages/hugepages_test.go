package hugepages

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestAnonRanges(t *testing.T) {
	maps := strings.Join([]string{
		"00400000-00bfe000 r-xp 00000000 fe:00 9978475    /bin/memfs",             // file, not writable
		"0156e000-015ee000 rw-p 0116e000 fe:00 9978475    /bin/memfs",             // file-backed data
		"015ee000-03644000 rw-p 00000000 00:00 0 ",                                // anonymous, 32 MiB
		"3ff560000000-3ff563c00000 ---p 00000000 00:00 0 ",                        // reserved, no access
		"3ff563c00000-3ff564400000 rw-p 00000000 00:00 0",                         // anonymous, 8 MiB
		"7f0b70dea000-7f0b70deb000 rw-p 00000000 00:00 0 ",                        // one page
		"7f0b9d7a5000-7f0b9d805000 rw-s 00000000 00:01 12    /dev/zero (deleted)", // shared
		"7fff296be000-7fff296df000 rw-p 00000000 00:00 0          [stack]",        // named
		"zz-yy rw-p 00000000 00:00 0",                                             // garbage
		"",
	}, "\n")
	require.Equal(t, []addrRange{
		{0x015ee000, 0x03644000},
		{0x3ff563c00000, 0x3ff564400000},
	}, anonRanges([]byte(maps)))
}

func TestSelected(t *testing.T) {
	for in, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never":   "always",
		"always madvise [never]":   "never",
		"always madvise never":     "",
		"[]":                       "",
	} {
		require.Equal(t, want, selected(in), in)
	}
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name string
		sys  System
		want uint64
		size uint64
	}{
		{"madvise", System{Mode: "madvise", Overcommit: "0", RAM: 24 << 30}, 4 << 30, 4 << 30},
		{"capped at half of RAM", System{Mode: "madvise", Overcommit: "1", RAM: 24 << 30}, 40 << 30, 12 << 30},
		{"rounded down to huge pages", System{Mode: "madvise", Overcommit: "0", RAM: 24 << 30}, 5<<20 + 1, 4 << 20},
		{"always needs nothing", System{Mode: "always", Overcommit: "0", RAM: 24 << 30}, 4 << 30, 0},
		{"never allows nothing", System{Mode: "never", Overcommit: "0", RAM: 24 << 30}, 4 << 30, 0},
		{"strict overcommit", System{Mode: "madvise", Overcommit: "2", RAM: 24 << 30}, 4 << 30, 0},
		{"nothing wanted", System{Mode: "madvise", Overcommit: "0", RAM: 24 << 30}, 1 << 20, 0},
		{"address space capped", System{Mode: "madvise", Overcommit: "0", RAM: 24 << 30, RlimitSet: true}, 4 << 30, 0},
		{"runtime opted out", System{Mode: "madvise", Overcommit: "0", RAM: 24 << 30, DisableTHP: true}, 4 << 30, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			size, why := Plan(tc.sys, tc.want)
			require.Equal(t, tc.size, size)
			require.Equal(t, size == 0, why != "", "a reason exactly when nothing is reserved: %q", why)
		})
	}
}

// After Reserve, memory the heap hands out later lies in an advised
// mapping: the kernel will fault it in huge pages.
func TestReserveAdvisesLaterHeap(t *testing.T) {
	if _, err := ReadSystem(); err != nil {
		t.Skipf("no transparent huge pages here: %v", err)
	}
	advised, err := Reserve(256 << 20)
	require.NoError(t, err)
	require.GreaterOrEqual(t, advised, int64(256<<20))

	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	flags := vmFlags(t, uintptr(unsafe.Pointer(&b[0])))
	require.Contains(t, strings.Fields(flags), "hg", "VmFlags of the heap mapping: %s", flags)
}

// vmFlags returns the VmFlags line of the mapping that holds addr.
func vmFlags(t *testing.T, addr uintptr) string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if r := anonRanges([]byte(line)); len(r) == 1 || isHeader(line) {
			in = len(r) == 1 && r[0].start <= addr && addr < r[0].end
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimPrefix(line, "VmFlags:")
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping holds %#x", addr)
	return ""
}

// isHeader reports whether an smaps line starts a mapping ("lo-hi perms ...").
func isHeader(line string) bool {
	lo, _, ok := strings.Cut(strings.Fields(line + " x")[0], "-")
	_, err := strconv.ParseUint(lo, 16, 64)
	return ok && err == nil
}
