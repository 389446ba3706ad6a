package posixtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RefDir returns a fresh directory on tmpfs (/dev/shm) for the reference
// side, removed when the test ends, or t.TempDir() when there is no tmpfs
// to use.
func RefDir(t testing.TB) string {
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if err := syscall.Statfs("/dev/shm", &st); err == nil && st.Type == tmpfsMagic {
		d, err := os.MkdirTemp("/dev/shm", "memfs-posix-ref-")
		if err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// LseekCases need the file system to answer SEEK_DATA and SEEK_HOLE
// itself (FUSE_LSEEK); without it the kernel reports the whole file as
// data.
var LseekCases = []string{"seek_data_hole", "seek_huge"}

// CaseNames lists every case but those in except, sorted.
func CaseNames(except ...string) []string {
	var names []string
	for n := range Cases {
		if !slices.Contains(except, n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Compare runs the named cases (all when names is empty), each in a new
// subdirectory of mount and of ref, and fails t for each case whose
// transcripts differ. A case that takes longer than timeout on either side
// fails; its goroutine is left behind, blocked in the kernel until the
// mount is torn down.
func Compare(t *testing.T, mount, ref string, timeout time.Duration, names ...string) {
	if len(names) == 0 {
		names = CaseNames()
	}
	for _, name := range names {
		c, ok := Cases[name]
		if !ok {
			t.Fatalf("no case %q", name)
		}
		t.Run(name, func(t *testing.T) {
			want, err := RunCase(c, filepath.Join(ref, name), timeout)
			if err != nil {
				t.Fatalf("reference side: %v", err)
			}
			got, err := RunCase(c, filepath.Join(mount, name), timeout)
			if err != nil {
				t.Fatalf("mount side: %v", err)
			}
			if d := Diff(want, got); d != "" {
				t.Errorf("mount differs from reference (-ref +mount):\n%s", d)
			}
		})
	}
}

// RunCase runs c in a new directory dir and returns its transcript, or an
// error if it did not finish within timeout.
func RunCase(c Case, dir string, timeout time.Duration) ([]string, error) {
	done := make(chan []string, 1)
	go func() {
		if err := os.Mkdir(dir, 0o755); err != nil {
			done <- []string{"mkdir case directory: " + errName(err)}
			return
		}
		r := NewRec(dir)
		defer r.CloseAll()
		c(r)
		done <- r.Lines()
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case lines := <-done:
		return lines, nil
	case <-t.C:
		return nil, fmt.Errorf("case did not finish within %v in %s", timeout, dir)
	}
}

// Diff shows the lines where two transcripts differ, with their line
// numbers, or "" when they are equal.
func Diff(want, got []string) string {
	var b strings.Builder
	n := max(len(want), len(got))
	shown := 0
	for i := 0; i < n && shown < 20; i++ {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			fmt.Fprintf(&b, "%4d - %s\n     + %s\n", i+1, w, g)
			shown++
		}
	}
	return b.String()
}
