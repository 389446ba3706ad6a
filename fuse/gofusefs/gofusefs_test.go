package gofusefs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// emptyRoot is an fsops.Ops with an empty root directory that counts
// lookups. Any operation it does not fake panics (the embedded nil Ops),
// which fails the test.
type emptyRoot struct {
	fsops.Ops
	lookups  atomic.Int64
	onLookup func() // called inside every lookup, before it answers
}

func (r *emptyRoot) Lookup(context.Context, uint64, string) (fsops.Attr, syscall.Errno) {
	r.lookups.Add(1)
	if r.onLookup != nil {
		r.onLookup()
	}
	return fsops.Attr{}, syscall.ENOENT
}

func (r *emptyRoot) GetAttr(_ context.Context, ino uint64) (fsops.Attr, syscall.Errno) {
	if ino != fsops.RootIno {
		return fsops.Attr{}, syscall.ENOENT
	}
	now := time.Now()
	return fsops.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Atime: now, Mtime: now, Ctime: now}, 0
}

// mountEmpty mounts r on a new directory, unmounted at cleanup.
func mountEmpty(t *testing.T, r *emptyRoot, watching bool) (*FS, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Skip("no fusermount3 (Debian package fuse3)")
	}
	dir := t.TempDir()
	f, err := Mount(dir, r, Config{AttrTimeout: time.Minute, Watching: func() bool { return watching }})
	require.NoError(t, err)
	go f.Serve()
	require.NoError(t, f.WaitMount())
	t.Cleanup(func() { _ = f.srv.Unmount() })
	return f, dir
}

// TestNegativeEntries checks when the kernel may cache a missing name: only
// while the change stream is applied, never when a round of change events
// passed during the lookup, and never after an invalidation of the name.
func TestNegativeEntries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		watching bool
		racing   bool // a change event round passes during each lookup
		want     int64
	}{
		{"watching: the second stat is answered by the kernel", true, false, 1},
		{"no change stream: every stat asks", false, false, 2},
		{"event during the lookup: not cached", true, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &emptyRoot{}
			var mounted atomic.Pointer[FS]
			if tc.racing {
				r.onLookup = func() {
					if f := mounted.Load(); f != nil {
						f.gen.Add(1)
					}
				}
			}
			f, dir := mountEmpty(t, r, tc.watching)
			mounted.Store(f)
			for range 2 {
				_, err := os.Stat(filepath.Join(dir, "missing"))
				require.ErrorIs(t, err, os.ErrNotExist)
			}
			require.Equal(t, tc.want, r.lookups.Load())

			// A change event naming the entry drops a cached absence.
			f.InvalidateEntry(fsops.RootIno, "missing")
			_, err := os.Stat(filepath.Join(dir, "missing"))
			require.ErrorIs(t, err, os.ErrNotExist)
			require.Equal(t, tc.want+1, r.lookups.Load())
		})
	}
}
