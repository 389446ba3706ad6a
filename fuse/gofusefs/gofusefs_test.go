package gofusefs

import (
	"context"
	"fmt"
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
	onLookup func()           // called inside every lookup, before it answers
	list     []fsops.DirEntry // the root's entries (ReadDirPlus, Lookup)
}

func (r *emptyRoot) Lookup(_ context.Context, _ uint64, name string) (fsops.Attr, syscall.Errno) {
	r.lookups.Add(1)
	if r.onLookup != nil {
		r.onLookup()
	}
	for _, e := range r.list {
		if e.Name == name {
			return fileAttr(e.Ino), 0
		}
	}
	return fsops.Attr{}, syscall.ENOENT
}

// ReadDirPlus lists r.list, whose entries carry attributes or not.
func (r *emptyRoot) ReadDirPlus(context.Context, uint64) ([]fsops.DirEntry, syscall.Errno) {
	return append([]fsops.DirEntry{
		{Name: ".", Ino: 1, Mode: syscall.S_IFDIR}, {Name: "..", Ino: 1, Mode: syscall.S_IFDIR},
	}, r.list...), 0
}

func fileAttr(ino uint64) fsops.Attr {
	now := time.Now()
	return fsops.Attr{Ino: ino, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Size: ino * 100, Atime: now, Mtime: now, Ctime: now}
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

// TestReadDirPlusSavesLookups lists a directory whose listing carries the
// attributes of some entries: stat of those needs no lookup, stat of the
// others does, and the sizes are the listing's.
func TestReadDirPlusSavesLookups(t *testing.T) {
	with := func(ino uint64) fsops.DirEntry {
		a := fileAttr(ino)
		return fsops.DirEntry{Name: fmt.Sprintf("f%d", ino), Ino: ino, Mode: syscall.S_IFREG, Attr: &a}
	}
	r := &emptyRoot{list: []fsops.DirEntry{with(2), with(3), {Name: "f4", Ino: 4, Mode: syscall.S_IFREG}}}
	_, dir := mountEmpty(t, r, true)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 3)
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		var ino uint64
		_, err = fmt.Sscanf(e.Name(), "f%d", &ino)
		require.NoError(t, err)
		require.Equal(t, int64(ino*100), info.Size(), e.Name())
	}
	require.Equal(t, int64(1), r.lookups.Load(), "only the entry listed without attributes is looked up")
}
