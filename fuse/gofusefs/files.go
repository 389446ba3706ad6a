package gofusefs

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// openOut fills the kernel's open reply.
func openOut(out *fuse.OpenOut, o fsops.OpenOut) {
	out.Fh = o.Handle
	if o.KeepCache {
		out.OpenFlags |= fuse.FOPEN_KEEP_CACHE
	}
}

// Open implements fuse.RawFileSystem.
func (f *FS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	o, e := f.ops.Open(ctx(), in.NodeId, int(in.Flags), caller(&in.InHeader))
	if e != 0 {
		return status(e)
	}
	openOut(out, o)
	return fuse.OK
}

// Create implements fuse.RawFileSystem.
func (f *FS) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	a, o, e := f.ops.Create(ctx(), in.NodeId, name, int(in.Flags), in.Mode&0o7777, caller(&in.InHeader))
	if e != 0 {
		return status(e)
	}
	f.entry(&out.EntryOut, a)
	openOut(&out.OpenOut, o)
	return fuse.OK
}

// Read implements fuse.RawFileSystem, filling go-fuse's buffer.
func (f *FS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	n, e := f.ops.Read(ctx(), in.NodeId, in.Fh, int64(in.Offset), buf[:in.Size])
	if e != 0 {
		return nil, status(e)
	}
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// Write implements fuse.RawFileSystem. data is reused once this returns;
// fsops copies what it keeps.
func (f *FS) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	n, e := f.ops.Write(ctx(), in.NodeId, in.Fh, int64(in.Offset), data)
	return uint32(n), status(e)
}

// Flush implements fuse.RawFileSystem (each close of a descriptor), which
// also ends the closing process's POSIX locks on the file.
func (f *FS) Flush(_ <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	e := f.ops.Flush(ctx(), in.NodeId, in.Fh)
	if le := f.ops.ReleaseLocks(ctx(), in.NodeId, in.LockOwner, false); e == 0 {
		e = le
	}
	return status(e)
}

// Fsync implements fuse.RawFileSystem.
func (f *FS) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return status(f.ops.Fsync(ctx(), in.NodeId))
}

// Lseek implements fuse.RawFileSystem: the kernel asks only for SEEK_DATA
// and SEEK_HOLE and sets the position itself; the offset arrives as the
// 64-bit pattern of a signed one, so a negative offset is ENXIO there.
func (f *FS) Lseek(_ <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	pos, e := f.ops.Lseek(ctx(), in.NodeId, in.Fh, int64(in.Offset), int(in.Whence))
	if e != 0 {
		return status(e)
	}
	out.Offset = uint64(pos)
	return fuse.OK
}

// Release implements fuse.RawFileSystem (the last close), which also ends
// the open file's flock lock.
func (f *FS) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	if in.ReleaseFlags&fuse.FUSE_RELEASE_FLOCK_UNLOCK != 0 {
		_ = f.ops.ReleaseLocks(ctx(), in.NodeId, in.LockOwner, true)
	}
	_ = f.ops.Release(ctx(), in.NodeId, in.Fh)
}

func lockOf(in *fuse.LkIn) fsops.Lock {
	return fsops.Lock{
		Owner: in.Owner, Type: in.Lk.Typ, Start: in.Lk.Start, End: in.Lk.End,
		Pid: in.Lk.Pid, Flock: in.LkFlags&fuse.LK_FLOCK != 0,
	}
}

// GetLk implements fuse.RawFileSystem (F_GETLK).
func (f *FS) GetLk(_ <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	lk, e := f.ops.GetLk(ctx(), in.NodeId, in.Fh, lockOf(in))
	out.Lk = fuse.FileLock{Start: lk.Start, End: lk.End, Typ: lk.Type, Pid: lk.Pid}
	return status(e)
}

// SetLk implements fuse.RawFileSystem (F_SETLK, flock with LOCK_NB).
func (f *FS) SetLk(_ <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return status(f.ops.SetLk(ctx(), in.NodeId, in.Fh, lockOf(in), false))
}

// SetLkw implements fuse.RawFileSystem (F_SETLKW, flock). The kernel's
// interrupt (the waiting process got a signal) ends the wait with EINTR.
func (f *FS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	c, stop := context.WithCancel(ctx())
	defer stop()
	go func() {
		select {
		case <-cancel:
			stop()
		case <-c.Done():
		}
	}()
	return status(f.ops.SetLk(c, in.NodeId, in.Fh, lockOf(in), true))
}

// Fallocate implements fuse.RawFileSystem: not supported, as with bazil
// (glibc's posix_fallocate then writes zeros).
func (f *FS) Fallocate(<-chan struct{}, *fuse.FallocateIn) fuse.Status {
	return fuse.Status(syscall.EOPNOTSUPP)
}

// dirHandle is one open directory: the stream the kernel reads, whose
// offsets stay valid across changes (fsops.DirStream).
type dirHandle struct {
	stream fsops.DirStream
}

// dirTable maps the kernel's directory handles to listings.
type dirTable struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]*dirHandle // guarded by mu
}

func (t *dirTable) open() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.m[t.next] = &dirHandle{}
	return t.next
}

func (t *dirTable) get(fh uint64) *dirHandle {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[fh]
}

func (t *dirTable) close(fh uint64) {
	t.mu.Lock()
	delete(t.m, fh)
	t.mu.Unlock()
}

// OpenDir implements fuse.RawFileSystem. The kernel opens only nodes it
// knows to be directories; the listing is read by the first READDIR.
func (f *FS) OpenDir(_ <-chan struct{}, _ *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.Fh = f.dirs.open()
	return fuse.OK
}

// ReadDir implements fuse.RawFileSystem.
func (f *FS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.readDir(in, out, false)
}

// ReadDirPlus implements fuse.RawFileSystem: the entries with their
// attributes, one query per 1024 names, so that `ls -l`, find or du need
// no lookup per name. An entry without attributes (see
// fsops.ClientOps.ReadDirPlus), and "." and "..", go as plain entries
// (node ID 0), which the kernel looks up if it needs them.
func (f *FS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.readDir(in, out, true)
}

func (f *FS) readDir(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	d := f.dirs.get(in.Fh)
	if d == nil {
		return fuse.EBADF
	}
	list := func() ([]fsops.DirEntry, syscall.Errno) { return f.ops.ReadDir(ctx(), in.NodeId) }
	if plus {
		list = func() ([]fsops.DirEntry, syscall.Errno) { return f.ops.ReadDirPlus(ctx(), in.NodeId) }
	}
	e := d.stream.Read(in.Offset, list, func(de fsops.DirEntry, off uint64) bool {
		e := fuse.DirEntry{Name: de.Name, Ino: de.Ino, Mode: de.Mode, Off: off}
		if !plus {
			return out.AddDirEntry(e)
		}
		eo := out.AddDirLookupEntry(e)
		if eo == nil {
			return false
		}
		if de.Attr != nil && de.Name != "." && de.Name != ".." {
			f.entry(eo, *de.Attr) // the kernel counts it as a lookup
		}
		return true
	})
	return status(e)
}

// ReleaseDir implements fuse.RawFileSystem.
func (f *FS) ReleaseDir(in *fuse.ReleaseIn) { f.dirs.close(in.Fh) }

// FsyncDir implements fuse.RawFileSystem: it returns once the directory's
// changes, and everything the mount buffered before them, are committed.
func (f *FS) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return status(f.ops.Fsync(ctx(), in.NodeId))
}
