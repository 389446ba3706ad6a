// Package gofusefs is the go-fuse (github.com/hanwen/go-fuse/v2) binding of
// the MemoryFS mount, beside the bazil.org/fuse one in fuse/bazilfs: a thin
// adapter from go-fuse's raw protocol API to fsops.Ops, so that the cost of
// the binding itself can be measured against bazil's on the same
// operations (docs/fuse.md, "Bindings").
//
// It holds no file system state beyond open directory listings and the
// kernel's lookup counts (to invalidate everything after a gap in the
// change stream), and must never translate errors (fsops does) or talk to
// the cluster other than through fsops.Ops.
//
// # Nodes
//
// The kernel's node ID is the cluster's inode number (the root is 1 in
// both), so no table maps one to the other and a forgotten node needs no
// cleanup.
//
// # What it does that bazil cannot
//
// Requests of up to 1 MiB instead of 128 KiB, a reader goroutine that
// answers its request itself instead of handing it to a new goroutine,
// READDIRPLUS (a listing hands the kernel every entry's attributes), and
// negative entries: a name looked up and not found is cached by the kernel
// for the attribute timeout while the cluster's change stream is open (a
// create elsewhere invalidates it like any other entry), so a program that
// stats a name before creating it costs one lookup, not two.
package gofusefs

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// MaxIO is the largest read or write request the binding asks the kernel
// for (go-fuse's and the kernel's limit).
const MaxIO = 1 << 20

// Config tunes the adapter's kernel caching and mount.
type Config struct {
	// AttrTimeout is how long the kernel may cache attributes, names and,
	// while Watching reports true, the absence of a name.
	AttrTimeout time.Duration
	// Covered, when set, decides how long the kernel may keep each
	// answer, Attr.Valid included: the mount caches under capabilities,
	// and the kernel may keep only what one covers while no other client
	// conflicts with it (fsops.ClientOps.KernelTimeout).
	Covered func(a fsops.Attr) time.Duration
	// Watching reports whether the cluster's change stream is being
	// applied; without it a missing name is not cached.
	Watching func() bool
	// Mount options.
	FSName         string
	AllowOther     bool
	WritebackCache bool
	// LocalLocks leaves fcntl and flock locks to this host's kernel
	// instead of the cluster (fsops/locks.go).
	LocalLocks    bool
	MaxReadahead  int
	MaxBackground int
	Congestion    int
	// Debug logs every request and reply through the log package.
	Debug bool
}

// FS serves one mount. Create it with Mount.
type FS struct {
	fuse.RawFileSystem // ENOSYS for everything not implemented here
	ops                fsops.Ops
	cfg                Config
	srv                *fuse.Server
	lookups            fsops.KernelNodes
	dirs               dirTable
	// gen counts rounds of change events; a lookup that saw a round pass
	// is not cached negatively (see Lookup).
	gen atomic.Uint64
}

var (
	_ fuse.RawFileSystem = (*FS)(nil)
	_ fsops.Invalidator  = (*FS)(nil)
	_ fsops.Resetter     = (*FS)(nil)
)

// Mount mounts ops on dir. Serve must then run to answer the kernel, and
// WaitMount returns once the kernel has initialised the mount.
func Mount(dir string, ops fsops.Ops, cfg Config) (*FS, error) {
	if cfg.AttrTimeout <= 0 {
		cfg.AttrTimeout = time.Second
	}
	if cfg.Watching == nil {
		cfg.Watching = func() bool { return false }
	}
	f := &FS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		ops:           ops, cfg: cfg,
		dirs: dirTable{m: map[uint64]*dirHandle{}},
	}
	srv, err := fuse.NewServer(f, dir, f.mountOptions())
	if err != nil {
		return nil, fmt.Errorf("go-fuse mount %s: %w", dir, err)
	}
	f.srv = srv
	return f, nil
}

func (f *FS) mountOptions() *fuse.MountOptions {
	o := &fuse.MountOptions{
		FsName:              f.cfg.FSName,
		Name:                "memfs",
		AllowOther:          f.cfg.AllowOther,
		Options:             []string{"default_permissions"},
		MaxWrite:            MaxIO,
		MaxReadAhead:        f.cfg.MaxReadahead,
		MaxBackground:       f.cfg.MaxBackground,
		CongestionThreshold: f.cfg.Congestion,
		// READDIRPLUS when the kernel sees the listing's names looked up
		// (ls -l, find), plain READDIR otherwise, as libfuse does.
		ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO,
		// Replies come from memory: go-fuse would first try a pipe
		// (splice), which only pays off for data read from a descriptor,
		// and fall back after two wasted system calls per read.
		DisableSplice: true,
		EnableLocks:   !f.cfg.LocalLocks,
		Debug:         f.cfg.Debug,
	}
	if f.cfg.WritebackCache {
		o.ExtraCapabilities |= fuse.CAP_WRITEBACK_CACHE
	}
	return o
}

// Serve answers the kernel until the file system is unmounted. The mount
// is usable once WaitMount returns.
func (f *FS) Serve() { f.srv.Serve() }

// WaitMount waits until the kernel has initialised the mount.
func (f *FS) WaitMount() error { return f.srv.WaitMount() }

// String implements fuse.RawFileSystem.
func (f *FS) String() string { return "memfs" }

// Init implements fuse.RawFileSystem.
func (f *FS) Init(*fuse.Server) {}

// ctx is the context of every operation: the kernel's interrupts are
// ignored, as in bazilfs (see bazilfs.uninterrupted): fsops bounds each
// operation by its own timeout.
func ctx() context.Context { return context.Background() }

func status(e syscall.Errno) fuse.Status { return fuse.Status(e) }

func caller(h *fuse.InHeader) fsops.Caller {
	return fsops.Caller{Uid: h.Uid, Gid: h.Gid, Pid: h.Pid}
}

// InvalidateAttr implements fsops.Invalidator. The kernel has no separate
// attribute-only notification; dropping no pages (offset -1) only
// invalidates the attributes.
func (f *FS) InvalidateAttr(ino uint64) { f.srv.InodeNotify(ino, -1, 0) }

// InvalidateData implements fsops.Invalidator: pages and attributes.
func (f *FS) InvalidateData(ino uint64) { f.srv.InodeNotify(ino, 0, 0) }

// InvalidateEntry implements fsops.Invalidator; a negative entry for the
// name is dropped too.
func (f *FS) InvalidateEntry(parent uint64, name string) {
	f.gen.Add(1)
	f.srv.EntryNotify(parent, name)
}

// InvalidateAll implements fsops.Resetter: every inode the kernel holds
// loses its attributes and pages. Negative entries cannot be listed; they
// run out with the attribute timeout.
func (f *FS) InvalidateAll() {
	f.gen.Add(1)
	f.lookups.InvalidateAll(f)
}

// Forget implements fuse.RawFileSystem.
func (f *FS) Forget(nodeid, nlookup uint64) { f.lookups.Forget(nodeid, nlookup) }

// fillAttr converts fsops attributes into go-fuse's.
func fillAttr(out *fuse.Attr, a fsops.Attr) {
	out.Ino = a.Ino
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid = a.Uid
	out.Gid = a.Gid
	out.Rdev = a.Rdev
	out.Blksize = MaxIO
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
}

// timeout is how long the kernel may keep a.
func (f *FS) timeout(a fsops.Attr) time.Duration {
	switch {
	case f.cfg.Covered != nil:
		return f.cfg.Covered(a)
	case a.Valid > 0:
		return a.Valid
	}
	return f.cfg.AttrTimeout
}

// entry fills a reply that hands the kernel a node.
func (f *FS) entry(out *fuse.EntryOut, a fsops.Attr) {
	out.NodeId = a.Ino
	out.Generation = a.Gen
	t := f.timeout(a)
	out.SetEntryTimeout(t)
	out.SetAttrTimeout(t)
	fillAttr(&out.Attr, a)
	f.lookups.Add(a.Ino)
}

// entryResult answers an operation that made a node.
func (f *FS) entryResult(out *fuse.EntryOut, a fsops.Attr, e syscall.Errno) fuse.Status {
	if e != 0 {
		return status(e)
	}
	f.entry(out, a)
	return fuse.OK
}
