// Package fsops is the FUSE-library-independent layer of the MemoryFS
// mount: the inode operations a kernel filesystem binding needs, each
// returning a syscall.Errno, implemented once over the MemoryFS client.
//
// A binding (bazil.org/fuse in fuse/bazilfs today; go-fuse could sit beside
// it) only converts its request structs to these calls and back, so the
// cost of the binding itself can be measured against another one.
//
// # Error handling
//
// Every exported operation of Ops goes through one wrapper (guard) that
// turns the client's error into an errno with ToErrno and recovers from a
// panic as EIO. Bindings never translate errors themselves.
//
// # Time limits
//
// Every operation runs under Options.OpTimeout: when the whole cluster is
// gone, a call fails with EIO after that long instead of hanging the
// process that made the system call.
//
// This package must never import a FUSE library, the server or the state
// machine.
package fsops

import (
	"context"
	"syscall"
	"time"
)

// RootIno is the inode number of the cluster's root directory.
const RootIno = 1

// Attr is what stat(2) reports for one inode. Mode carries the S_IFMT type
// bits as well as the permission bits.
type Attr struct {
	Ino    uint64
	Mode   uint32
	Nlink  uint32
	Uid    uint32
	Gid    uint32
	Size   uint64
	Blocks uint64 // 512-byte units
	Atime  time.Time
	Mtime  time.Time
	Ctime  time.Time
	Gen    uint64
	Rdev   uint32 // a device's number (Linux encoding)
	// Valid, when not 0, is how long the kernel may cache these
	// attributes (and the name that led to them) instead of the mount's
	// attribute timeout: what the mount's capabilities guarantee
	// (metacache.go).
	Valid time.Duration
}

// IsDir reports whether the attributes are a directory's.
func (a Attr) IsDir() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// Caller is the process a request comes from (from the FUSE request
// header). Created inodes are owned by Uid and Gid.
type Caller struct {
	Uid, Gid, Pid uint32
}

// SetAttrIn names the attributes to change; the Set* flags say which.
type SetAttrIn struct {
	SetMode, SetUid, SetGid, SetSize bool
	SetAtime, SetMtime               bool
	AtimeNow, MtimeNow               bool // set to the cluster's time
	Mode                             uint32
	Uid, Gid                         uint32
	Size                             uint64
	Atime, Mtime                     time.Time
	// Handle, when not 0, is the open file the change comes through
	// (ftruncate): it works on a file already unlinked.
	Handle uint64
}

// DirEntry is one name in a directory. Mode holds the type bits only.
type DirEntry struct {
	Name string
	Ino  uint64
	Mode uint32
	// Attr is the entry's attributes, from ReadDirPlus only, and only
	// when they are as new as what this mount acknowledged (nil otherwise).
	Attr *Attr
}

// StatfsOut is what statfs(2) reports.
type StatfsOut struct {
	BlockSize  uint32
	Blocks     uint64 // total, in BlockSize units
	BlocksFree uint64
	Files      uint64 // inodes in use
	FilesFree  uint64
	NameLen    uint32
}

// OpenOut is the result of opening a file.
type OpenOut struct {
	Handle uint64
	// KeepCache tells the kernel it may keep the file's cached pages
	// across this open: true while change events from the cluster are
	// being received, so that a stale page is always invalidated.
	KeepCache bool
}

// XattrCreate and XattrReplace are the setxattr(2) flags.
const (
	XattrCreate  = 1
	XattrReplace = 2
)

// Ops is every inode operation the mount serves. Inodes are the cluster's
// inode numbers; handles are the values Open and Create returned. All
// methods are safe for concurrent use.
type Ops interface {
	Lookup(ctx context.Context, parent uint64, name string) (Attr, syscall.Errno)
	GetAttr(ctx context.Context, ino uint64) (Attr, syscall.Errno)
	SetAttr(ctx context.Context, ino uint64, in SetAttrIn) (Attr, syscall.Errno)
	Access(ctx context.Context, ino uint64, mask uint32, c Caller) syscall.Errno

	// Open and Create take open(2) flags with Linux values.
	Open(ctx context.Context, ino uint64, flags int, c Caller) (OpenOut, syscall.Errno)
	Create(ctx context.Context, parent uint64, name string, flags int, mode uint32, c Caller) (Attr, OpenOut, syscall.Errno)
	Read(ctx context.Context, ino, handle uint64, off int64, dst []byte) (int, syscall.Errno)
	Write(ctx context.Context, ino, handle uint64, off int64, data []byte) (int, syscall.Errno)
	// Flush is close(2) on one descriptor: the file's writes are
	// committed when it returns.
	Flush(ctx context.Context, ino, handle uint64) syscall.Errno
	// Fsync returns once every write to ino made through this mount is
	// committed to the cluster.
	Fsync(ctx context.Context, ino uint64) syscall.Errno
	Release(ctx context.Context, ino, handle uint64) syscall.Errno
	// Lseek answers lseek(2)'s SEEK_DATA and SEEK_HOLE (whence) from
	// off: where the next data or hole starts, or ENXIO.
	Lseek(ctx context.Context, ino, handle uint64, off int64, whence int) (int64, syscall.Errno)

	// ReadDir lists "." and ".." first, then the directory's entries.
	ReadDir(ctx context.Context, ino uint64) ([]DirEntry, syscall.Errno)
	// ReadDirPlus is ReadDir with the entries' attributes where known
	// (DirEntry.Attr), for a binding that answers READDIRPLUS.
	ReadDirPlus(ctx context.Context, ino uint64) ([]DirEntry, syscall.Errno)
	// Mknod makes a regular file (mode carries S_IFREG or no type bits),
	// a FIFO, a socket or a device (rdev: its number, Linux encoding).
	Mknod(ctx context.Context, parent uint64, name string, mode, rdev uint32, c Caller) (Attr, syscall.Errno)
	Mkdir(ctx context.Context, parent uint64, name string, mode uint32, c Caller) (Attr, syscall.Errno)
	// Rmdir, Unlink and Rename take the caller to enforce the sticky bit
	// (see ClientOps.sticky).
	Rmdir(ctx context.Context, parent uint64, name string, c Caller) syscall.Errno
	Unlink(ctx context.Context, parent uint64, name string, c Caller) syscall.Errno
	Rename(ctx context.Context, parent uint64, name string, newParent uint64, newName string, c Caller) syscall.Errno
	Symlink(ctx context.Context, parent uint64, name, target string, c Caller) (Attr, syscall.Errno)
	Readlink(ctx context.Context, ino uint64) (string, syscall.Errno)
	Link(ctx context.Context, ino, newParent uint64, newName string) (Attr, syscall.Errno)

	GetXattr(ctx context.Context, ino uint64, name string) ([]byte, syscall.Errno)
	ListXattr(ctx context.Context, ino uint64) ([]string, syscall.Errno)
	SetXattr(ctx context.Context, ino uint64, name string, value []byte, flags uint32) syscall.Errno
	RemoveXattr(ctx context.Context, ino uint64, name string) syscall.Errno

	Statfs(ctx context.Context) (StatfsOut, syscall.Errno)

	// File locks held in the cluster (locks.go), for a binding that
	// asked the kernel for them. GetLk is F_GETLK; SetLk takes, changes
	// or releases a lock, and with wait (F_SETLKW, flock without
	// LOCK_NB) waits for it until ctx is cancelled (EINTR); ReleaseLocks
	// drops an owner's POSIX locks (at FLUSH) or flock locks (at RELEASE
	// with the flock-unlock flag) on ino.
	GetLk(ctx context.Context, ino, handle uint64, lk Lock) (Lock, syscall.Errno)
	SetLk(ctx context.Context, ino, handle uint64, lk Lock, wait bool) syscall.Errno
	ReleaseLocks(ctx context.Context, ino, owner uint64, flock bool) syscall.Errno
}

// Invalidator is what a binding offers so that changes made elsewhere in
// the cluster reach the kernel's caches. Each call is best effort: an
// inode or entry the kernel does not hold is not an error.
type Invalidator interface {
	InvalidateAttr(ino uint64)
	InvalidateData(ino uint64)
	InvalidateEntry(parent uint64, name string)
}
