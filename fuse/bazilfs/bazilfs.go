// Package bazilfs is the bazil.org/fuse binding of the MemoryFS mount: a
// thin adapter that turns bazil's request structs into fsops.Ops calls and
// their results back into responses, and offers the kernel cache
// invalidation that fsops' change watcher drives.
//
// It holds no file system state of its own beyond a short-lived stash of
// attributes (see attrStash) and must never translate errors (fsops does)
// or talk to the cluster other than through fsops.Ops.
//
// # Nodes
//
// A node is the comparable value {fs, ino}: bazil keys its node table by
// the Node value, so every lookup of one inode yields the same kernel node
// ID without a table of ours, and a node forgotten by the kernel needs no
// cleanup.
//
// # Limits of the binding
//
// bazil caps reads and writes at 128 KiB per request, has no READDIRPLUS,
// no RENAME2 flags and no splice, answers mkdir/symlink/link with its own
// one-minute entry timeout, and drops the sticky bit when encoding modes
// (the binding answers the GETATTR of a sticky inode itself, sticky.go).
package bazilfs

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// MaxIO is the largest read or write request bazil.org/fuse accepts on
// Linux.
const MaxIO = 128 << 10

// Config tunes the adapter's kernel caching.
type Config struct {
	// AttrTimeout is how long the kernel may cache an inode's attributes.
	AttrTimeout time.Duration
	// EntryTimeout is how long the kernel may cache a name lookup.
	EntryTimeout time.Duration
	// Covered, when set, decides how long the kernel may keep each
	// answer, Attr.Valid included: the mount caches under capabilities,
	// and the kernel may keep only what one covers while no other client
	// conflicts with it (fsops.ClientOps.KernelTimeout).
	Covered func(a fsops.Attr) time.Duration
	// Debug, if set, receives bazil's trace of every request and reply.
	Debug func(msg any)
}

// FS serves one mount. Create it with New and run it with Serve.
type FS struct {
	ops   fsops.Ops
	cfg   Config
	srv   atomic.Pointer[fs.Server]
	stash attrStash
	known fsops.KernelNodes
	dev   atomic.Pointer[os.File] // the FUSE device, for sticky.go
}

var (
	_ fs.FS                  = (*FS)(nil)
	_ fs.FSStatfser          = (*FS)(nil)
	_ fsops.Invalidator      = (*FS)(nil)
	_ fs.NodeGetattrer       = node{}
	_ fs.NodeSetattrer       = node{}
	_ fs.NodeRequestLookuper = node{}
	_ fs.NodeCreater         = node{}
	_ fs.NodeOpener          = node{}
	_ fs.NodeMkdirer         = node{}
	_ fs.NodeMknoder         = node{}
	_ fs.NodeRemover         = node{}
	_ fs.NodeRenamer         = node{}
	_ fs.NodeSymlinker       = node{}
	_ fs.NodeReadlinker      = node{}
	_ fs.NodeLinker          = node{}
	_ fs.NodeFsyncer         = node{}
	_ fs.NodeAccesser        = node{}
	_ fs.NodeGetxattrer      = node{}
	_ fs.NodeListxattrer     = node{}
	_ fs.NodeSetxattrer      = node{}
	_ fs.NodeRemovexattrer   = node{}
	_ fs.HandleReader        = (*fileHandle)(nil)
	_ fs.HandleWriter        = (*fileHandle)(nil)
	_ fs.HandleFlusher       = (*fileHandle)(nil)
	_ fs.HandleReleaser      = (*fileHandle)(nil)
	_ fs.HandlePOSIXLocker   = (*fileHandle)(nil)
	_ fs.HandleFlockLocker   = (*fileHandle)(nil)
	_ fs.HandleReadDirAller  = (*dirHandle)(nil)
)

// New returns the adapter over ops.
func New(ops fsops.Ops, cfg Config) *FS {
	if cfg.AttrTimeout <= 0 {
		cfg.AttrTimeout = time.Second
	}
	if cfg.EntryTimeout <= 0 {
		cfg.EntryTimeout = cfg.AttrTimeout
	}
	return &FS{ops: ops, cfg: cfg, stash: attrStash{m: map[uint64]fsops.Attr{}}}
}

// Serve answers the kernel's requests on conn until the file system is
// unmounted.
func (f *FS) Serve(conn *fuse.Conn) error {
	if dev := devOf(conn); dev != nil {
		f.dev.Store(dev)
	}
	srv := fs.New(conn, &fs.Config{Debug: f.cfg.Debug})
	f.srv.Store(srv)
	return srv.Serve(f)
}

// Root implements fs.FS.
func (f *FS) Root() (fs.Node, error) { return node{f, fsops.RootIno}, nil }

// Statfs implements fs.FSStatfser.
func (f *FS) Statfs(ctx context.Context, _ *fuse.StatfsRequest, resp *fuse.StatfsResponse) error {
	st, e := f.ops.Statfs(uninterrupted(ctx))
	if e != 0 {
		return e
	}
	resp.Bsize = st.BlockSize
	resp.Frsize = st.BlockSize
	resp.Blocks = st.Blocks
	resp.Bfree = st.BlocksFree
	resp.Bavail = st.BlocksFree
	resp.Files = st.Files + st.FilesFree
	resp.Ffree = st.FilesFree
	resp.Namelen = st.NameLen
	return nil
}

// InvalidateAttr implements fsops.Invalidator.
func (f *FS) InvalidateAttr(ino uint64) {
	if srv := f.srv.Load(); srv != nil {
		ignoreNotCached(srv.InvalidateNodeAttr(node{f, ino}))
	}
}

// InvalidateData implements fsops.Invalidator; it drops attributes too.
func (f *FS) InvalidateData(ino uint64) {
	if srv := f.srv.Load(); srv != nil {
		ignoreNotCached(srv.InvalidateNodeData(node{f, ino}))
	}
}

// InvalidateEntry implements fsops.Invalidator.
func (f *FS) InvalidateEntry(parent uint64, name string) {
	if srv := f.srv.Load(); srv != nil {
		ignoreNotCached(srv.InvalidateEntry(node{f, parent}, name))
	}
}

// InvalidateAll implements fsops.Resetter: it drops the cached attributes
// and pages of every inode the kernel was given and not yet forgotten.
func (f *FS) InvalidateAll() { f.known.InvalidateAll(f) }

// ignoreNotCached drops the expected answers of a best-effort
// invalidation: the kernel does not hold the node, or the connection is
// already closing.
func ignoreNotCached(err error) {
	if err == nil || errors.Is(err, fuse.ErrNotCached) {
		return
	}
	_ = err // ENOENT/ENOTCONN while unmounting: nothing left to invalidate.
}

// attrStash hands the attributes a lookup, create or setattr already
// received to the Attr call bazil makes right after it, saving one round
// trip to the cluster per new kernel node.
type attrStash struct {
	mu sync.Mutex
	m  map[uint64]fsops.Attr // guarded by mu
}

func (s *attrStash) put(a fsops.Attr) {
	s.mu.Lock()
	s.m[a.Ino] = a
	s.mu.Unlock()
}

func (s *attrStash) take(ino uint64) (fsops.Attr, bool) {
	s.mu.Lock()
	a, ok := s.m[ino]
	delete(s.m, ino)
	s.mu.Unlock()
	return a, ok
}

func caller(h *fuse.Header) fsops.Caller {
	return fsops.Caller{Uid: h.Uid, Gid: h.Gid, Pid: h.Pid}
}

// timeout is how long the kernel may keep a (def when a does not say
// and the mount does not cache under capabilities).
func (f *FS) timeout(a fsops.Attr, def time.Duration) time.Duration {
	switch {
	case f.cfg.Covered != nil:
		return f.cfg.Covered(a)
	case a.Valid > 0:
		return a.Valid
	}
	return def
}

// fillAttr converts fsops attributes into bazil's.
func (f *FS) fillAttr(out *fuse.Attr, a fsops.Attr) {
	out.Valid = f.timeout(a, f.cfg.AttrTimeout)
	if a.Mode&syscall.S_ISVTX != 0 && f.dev.Load() != nil {
		out.Valid = 0 // bazil drops the bit: stat must ask (sticky.go)
	}
	out.Inode = a.Ino
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Atime = a.Atime
	out.Mtime = a.Mtime
	out.Ctime = a.Ctime
	out.Mode = fileMode(a.Mode)
	out.Nlink = a.Nlink
	out.Uid = a.Uid
	out.Gid = a.Gid
	out.Rdev = a.Rdev
	out.BlockSize = MaxIO
}

// fileMode turns a unix st_mode into an os.FileMode.
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		mode |= os.ModeDir
	case syscall.S_IFLNK:
		mode |= os.ModeSymlink
	case syscall.S_IFIFO:
		mode |= os.ModeNamedPipe
	case syscall.S_IFSOCK:
		mode |= os.ModeSocket
	case syscall.S_IFCHR:
		mode |= os.ModeDevice | os.ModeCharDevice
	case syscall.S_IFBLK:
		mode |= os.ModeDevice
	}
	if m&syscall.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// unixPerm turns the permission part of an os.FileMode into st_mode bits.
func unixPerm(m os.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		p |= syscall.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		p |= syscall.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		p |= syscall.S_ISVTX
	}
	return p
}

// fileType turns the type part of an os.FileMode into S_IFMT bits.
func fileType(m os.FileMode) uint32 {
	switch {
	case m&os.ModeDir != 0:
		return syscall.S_IFDIR
	case m&os.ModeSymlink != 0:
		return syscall.S_IFLNK
	case m&os.ModeNamedPipe != 0:
		return syscall.S_IFIFO
	case m&os.ModeSocket != 0:
		return syscall.S_IFSOCK
	case m&os.ModeCharDevice != 0:
		return syscall.S_IFCHR
	case m&os.ModeDevice != 0:
		return syscall.S_IFBLK
	}
	return syscall.S_IFREG
}

// direntType maps st_mode type bits to a readdir d_type.
func direntType(m uint32) fuse.DirentType {
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fuse.DT_Dir
	case syscall.S_IFLNK:
		return fuse.DT_Link
	case syscall.S_IFREG:
		return fuse.DT_File
	case syscall.S_IFIFO:
		return fuse.DT_FIFO
	case syscall.S_IFSOCK:
		return fuse.DT_Socket
	}
	return fuse.DT_Unknown
}

// errOrNil keeps a zero errno from becoming a non-nil error.
func errOrNil(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// uninterrupted keeps the kernel's interrupts from cancelling an
// operation. bazil cancels a request's context when the kernel sends
// INTERRUPT, which it does whenever the calling thread gets any signal:
// Go's own preemption signal (SIGURG), a profiler's timer, a terminal
// resize. Answering EINTR then breaks programs that call stat or open
// without retrying, and an operation cut off mid-flight may have been
// applied by the cluster all the same (a create that reports failure but
// left the file). Every operation is bounded by the mount's operation
// timeout instead, as hard NFS mounts do.
func uninterrupted(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }
