package client

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Open flags of the MemoryFS exclusive open, to combine with the os.O_*
// flags in OpenFile. At most one exclusive handle holds a file at a time.
const (
	// Exclusive fails the open with EWOULDBLOCK (errors.Is(err,
	// syscall.EWOULDBLOCK)) when another handle holds the file.
	Exclusive = 1 << 29
	// ExclusiveWait waits, in FIFO order with other waiters, until the
	// file is free. The wait ends with the context of OpenFileContext (or
	// the Client's); it is not bounded by the retry timeout.
	ExclusiveWait = 1 << 30
)

// linuxFlags converts os.O_* flags to the Linux values on the wire.
func linuxFlags(flag int) uint32 {
	var f uint32
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_WRONLY:
		f = linuxWRONLY
	case os.O_RDWR:
		f = linuxRDWR
	}
	for _, b := range [...]struct {
		os    int
		linux uint32
	}{{os.O_CREATE, linuxCREAT}, {os.O_EXCL, linuxEXCL}, {os.O_TRUNC, linuxTRUNC}, {os.O_APPEND, linuxAPPEND}} {
		if flag&b.os != 0 {
			f |= b.linux
		}
	}
	return f
}

// File is an open file (or directory) of a MemoryFS cluster. Its offset is
// kept in the client. Read, Write and Seek on one File are serialised;
// ReadAt and WriteAt may run concurrently. Its methods run under the
// context of the Client that opened it. A File whose session expired fails
// every operation with ESTALE; Close it.
type File struct {
	c    *Client
	name string
	h    uint64 // client handle; 0 for a directory opened without one
	ino  uint64
	flag int

	mu     sync.Mutex // guards everything below
	off    int64
	closed bool
	dir    dirReader
}

// Open opens name for reading.
func (c *Client) Open(name string) (*File, error) {
	return c.OpenFileContext(c.ctx, name, os.O_RDONLY, 0)
}

// Create creates or truncates name (mode 0666 before any umask, which
// MemoryFS does not apply) and opens it for reading and writing.
func (c *Client) Create(name string) (*File, error) {
	return c.OpenFileContext(c.ctx, name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// OpenFile opens name with os.O_* flags, plus Exclusive or ExclusiveWait;
// perm applies to a created file.
func (c *Client) OpenFile(name string, flag int, perm fs.FileMode) (*File, error) {
	return c.OpenFileContext(c.ctx, name, flag, perm)
}

// OpenFileContext is OpenFile under ctx, which also bounds an
// ExclusiveWait. The File's later methods run under the Client's context.
func (c *Client) OpenFileContext(ctx context.Context, name string, flag int, perm fs.FileMode) (*File, error) {
	loc := &pb.Loc{Path: clean(name)}
	excl := flag&(Exclusive|ExclusiveWait) != 0
	h, attr, err := c.OpenLoc(ctx, loc, linuxFlags(flag), modeBits(perm), c.k.cfg.uid, c.k.cfg.gid, excl, flag&ExclusiveWait != 0)
	if errors.Is(err, syscall.EISDIR) && flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC) == 0 && !excl {
		// A node that does not hand out handles for directories: a
		// directory needs none to be listed.
		attr, err = c.stat(ctx, "open", loc)
		h = 0
	}
	if err != nil {
		return nil, withPath(err, "open", name)
	}
	return &File{c: c, name: name, h: h, ino: attr.GetIno(), flag: flag}, nil
}

// withPath makes err (nil stays nil) an *fs.PathError naming op and name:
// the one in its chain gets them, or a new one wraps it.
func withPath(err error, op, name string) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		pe.Op, pe.Path = op, name
		return err
	}
	return pathErr(op, name, err)
}

// Name returns the name the file was opened with.
func (f *File) Name() string { return f.name }

// Ino returns the file's inode number.
func (f *File) Ino() uint64 { return f.ino }

// check reports whether f is usable; the caller holds f.mu.
func (f *File) check(op string) error {
	if f.closed {
		return pathErr(op, f.name, fs.ErrClosed)
	}
	if f.h == 0 && op != "readdir" && op != "stat" {
		return pathErr(op, f.name, syscall.EISDIR)
	}
	return nil
}

// Read reads up to len(p) bytes from the offset and advances it. At the
// end of the file it returns 0, io.EOF.
func (f *File) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := f.c.ReadHandle(f.c.ctx, f.h, f.off, p)
	f.off += int64(n)
	if err != nil {
		return n, withPath(err, "read", f.name)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// ReadAt reads len(p) bytes from off; fewer only at the end of the file,
// with io.EOF.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if err := f.usable("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("read", f.name, errors.New("negative offset"))
	}
	n, err := f.c.ReadHandle(f.c.ctx, f.h, off, p)
	if err != nil {
		return n, withPath(err, "read", f.name)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *File) usable(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.check(op)
}

// Write writes p at the offset (at the end of the file with O_APPEND) and
// advances it. The data is committed to the cluster when Write returns.
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	appendMode := f.flag&os.O_APPEND != 0
	n, attr, err := f.c.writeHandle(f.c.ctx, f.h, f.off, p, appendMode)
	if appendMode && attr != nil {
		f.off = int64(attr.GetSize())
	} else {
		f.off += int64(n)
	}
	if err != nil {
		return n, withPath(err, "write", f.name)
	}
	if n < len(p) {
		return n, pathErr("write", f.name, io.ErrShortWrite)
	}
	return n, nil
}

// WriteString is Write of a string.
func (f *File) WriteString(s string) (int, error) { return f.Write([]byte(s)) }

// WriteAt writes p at off without moving the offset. Like os.File, it is
// refused on a file opened with O_APPEND.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if err := f.usable("write"); err != nil {
		return 0, err
	}
	if f.flag&os.O_APPEND != 0 {
		return 0, pathErr("write", f.name, errors.New("WriteAt on a file opened with O_APPEND"))
	}
	if off < 0 {
		return 0, pathErr("write", f.name, errors.New("negative offset"))
	}
	n, _, err := f.c.WriteHandle(f.c.ctx, f.h, off, p)
	if err != nil {
		return n, withPath(err, "write", f.name)
	}
	if n < len(p) {
		return n, pathErr("write", f.name, io.ErrShortWrite)
	}
	return n, nil
}

// Seek sets the offset for the next Read or Write.
func (f *File) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("seek"); err != nil {
		return 0, err
	}
	base := int64(0)
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = f.off
	case io.SeekEnd:
		a, err := f.c.GetAttr(f.c.ctx, f.ino)
		if err != nil {
			return 0, withPath(err, "seek", f.name)
		}
		base = int64(a.GetSize())
	default:
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	if base+offset < 0 {
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	f.off = base + offset
	return f.off, nil
}

// Stat returns the file's attributes.
func (f *File) Stat() (fs.FileInfo, error) {
	if err := f.usable("stat"); err != nil {
		return nil, err
	}
	a, err := f.c.GetAttr(f.c.ctx, f.ino)
	if err != nil {
		return nil, withPath(err, "stat", f.name)
	}
	return fileInfo{name: path.Base(f.name), a: a}, nil
}

// Truncate changes the file's size.
func (f *File) Truncate(size int64) error {
	if err := f.usable("truncate"); err != nil {
		return err
	}
	_, err := f.c.SetAttr(f.c.ctx, &pb.SetAttrCmd{
		Loc: &pb.Loc{Ino: f.ino}, Handle: f.h, Valid: uint32(pb.SetAttrBit_SET_SIZE), Size: size,
	})
	return withPath(err, "truncate", f.name)
}

// Sync returns once every write made through f has been committed. Since a
// Write returns only after its data is committed, there is never anything
// left to wait for; Sync only reports a closed file.
func (f *File) Sync() error {
	return f.usable("sync")
}

// ReadDir lists a directory, as os.File.ReadDir does: with n > 0 at most n
// entries per call and io.EOF at the end; otherwise everything left. The
// listing is taken at the first call and is sorted by name.
func (f *File) ReadDir(n int) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("readdir"); err != nil {
		return nil, err
	}
	ents, err := f.dir.readDir(n, func() ([]fs.DirEntry, error) {
		return f.c.listDir(f.c.ctx, &pb.Loc{Ino: f.ino})
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return ents, withPath(err, "readdir", f.name)
	}
	return ents, err
}

// Close closes the file, releasing its exclusive open if it holds one.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, fs.ErrClosed)
	}
	f.closed = true
	if f.h == 0 {
		return nil
	}
	return withPath(f.c.CloseHandle(f.c.ctx, f.h), "close", f.name)
}
