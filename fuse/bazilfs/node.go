package bazilfs

import (
	"context"
	"syscall"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// node is one inode as bazil sees it. It is a comparable value: see the
// package comment.
type node struct {
	fs  *FS
	ino uint64
}

// Attr implements fs.Node. bazil calls it right after a lookup, create or
// setattr, whose attributes are in the stash; otherwise it asks the
// cluster.
func (n node) Attr(ctx context.Context, a *fuse.Attr) error {
	at, ok := n.fs.stash.take(n.ino)
	if !ok {
		var e syscall.Errno
		if at, e = n.fs.ops.GetAttr(uninterrupted(ctx), n.ino); e != 0 {
			return e
		}
	}
	n.fs.fillAttr(a, at)
	return nil
}

// Getattr implements fs.NodeGetattrer: stat always asks the cluster (the
// kernel caches the answer for AttrTimeout).
func (n node) Getattr(ctx context.Context, req *fuse.GetattrRequest, resp *fuse.GetattrResponse) error {
	at, e := n.fs.ops.GetAttr(uninterrupted(ctx), n.ino)
	if e != 0 {
		return e
	}
	n.fs.answerSticky(req.Header.ID, at) // bazil's own reply then finds the request answered
	n.fs.fillAttr(&resp.Attr, at)
	return nil
}

// Setattr implements fs.NodeSetattrer (chmod, chown, truncate, utimens).
func (n node) Setattr(ctx context.Context, req *fuse.SetattrRequest, _ *fuse.SetattrResponse) error {
	v := req.Valid
	in := fsops.SetAttrIn{
		SetMode: v.Mode(), SetUid: v.Uid(), SetGid: v.Gid(), SetSize: v.Size(),
		SetAtime: v.Atime() || v.AtimeNow(), SetMtime: v.Mtime() || v.MtimeNow(),
		AtimeNow: v.AtimeNow(), MtimeNow: v.MtimeNow(),
		Mode: unixPerm(req.Mode), Uid: req.Uid, Gid: req.Gid, Size: req.Size,
		Atime: req.Atime, Mtime: req.Mtime,
	}
	at, e := n.fs.ops.SetAttr(uninterrupted(ctx), n.ino, in)
	if e != 0 {
		return e
	}
	// bazil fills the response through Attr right after this returns.
	n.fs.stash.put(at)
	return nil
}

// Lookup implements fs.NodeRequestLookuper so that the entry timeout is
// ours rather than bazil's default minute.
func (n node) Lookup(ctx context.Context, req *fuse.LookupRequest, resp *fuse.LookupResponse) (fs.Node, error) {
	at, e := n.fs.ops.Lookup(uninterrupted(ctx), n.ino, req.Name)
	if e != 0 {
		return nil, e
	}
	resp.EntryValid = n.fs.timeout(at, n.fs.cfg.EntryTimeout)
	return n.fs.newNode(at), nil
}

// newNode stashes a's attributes for bazil's following Attr call.
func (f *FS) newNode(a fsops.Attr) node {
	f.stash.put(a)
	f.known.Add(a.Ino)
	return node{f, a.Ino}
}

// Forget implements fs.NodeForgetter: the kernel dropped the node.
func (n node) Forget() { n.fs.known.Forget(n.ino, fsops.ForgetAll) }

// Access implements fs.NodeAccesser. With default_permissions the kernel
// checks modes itself and rarely asks.
func (n node) Access(ctx context.Context, req *fuse.AccessRequest) error {
	return errOrNil(n.fs.ops.Access(uninterrupted(ctx), n.ino, req.Mask, caller(&req.Header)))
}

// Open implements fs.NodeOpener.
func (n node) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	if req.Dir {
		return &dirHandle{fs: n.fs, ino: n.ino}, nil
	}
	out, e := n.fs.ops.Open(uninterrupted(ctx), n.ino, int(req.Flags), caller(&req.Header))
	if e != 0 {
		return nil, e
	}
	if out.KeepCache {
		resp.Flags |= fuse.OpenKeepCache
	}
	return &fileHandle{fs: n.fs, ino: n.ino, h: out.Handle}, nil
}

// Create implements fs.NodeCreater.
func (n node) Create(ctx context.Context, req *fuse.CreateRequest, resp *fuse.CreateResponse) (fs.Node, fs.Handle, error) {
	at, out, e := n.fs.ops.Create(uninterrupted(ctx), n.ino, req.Name, int(req.Flags), unixPerm(req.Mode), caller(&req.Header))
	if e != 0 {
		return nil, nil, e
	}
	resp.EntryValid = n.fs.timeout(at, n.fs.cfg.EntryTimeout)
	if out.KeepCache {
		resp.Flags |= fuse.OpenKeepCache
	}
	return n.fs.newNode(at), &fileHandle{fs: n.fs, ino: at.Ino, h: out.Handle}, nil
}

// Mkdir implements fs.NodeMkdirer.
func (n node) Mkdir(ctx context.Context, req *fuse.MkdirRequest) (fs.Node, error) {
	at, e := n.fs.ops.Mkdir(uninterrupted(ctx), n.ino, req.Name, unixPerm(req.Mode), caller(&req.Header))
	if e != 0 {
		return nil, e
	}
	return n.fs.newNode(at), nil
}

// Mknod implements fs.NodeMknoder.
func (n node) Mknod(ctx context.Context, req *fuse.MknodRequest) (fs.Node, error) {
	mode := unixPerm(req.Mode) | fileType(req.Mode)
	at, e := n.fs.ops.Mknod(uninterrupted(ctx), n.ino, req.Name, mode, req.Rdev, caller(&req.Header))
	if e != 0 {
		return nil, e
	}
	return n.fs.newNode(at), nil
}

// Remove implements fs.NodeRemover (unlink and rmdir).
func (n node) Remove(ctx context.Context, req *fuse.RemoveRequest) error {
	if req.Dir {
		return errOrNil(n.fs.ops.Rmdir(uninterrupted(ctx), n.ino, req.Name, caller(&req.Header)))
	}
	return errOrNil(n.fs.ops.Unlink(uninterrupted(ctx), n.ino, req.Name, caller(&req.Header)))
}

// Rename implements fs.NodeRenamer.
func (n node) Rename(ctx context.Context, req *fuse.RenameRequest, newDir fs.Node) error {
	nd, ok := newDir.(node)
	if !ok {
		return syscall.EXDEV
	}
	return errOrNil(n.fs.ops.Rename(uninterrupted(ctx), n.ino, req.OldName, nd.ino, req.NewName, caller(&req.Header)))
}

// Symlink implements fs.NodeSymlinker.
func (n node) Symlink(ctx context.Context, req *fuse.SymlinkRequest) (fs.Node, error) {
	at, e := n.fs.ops.Symlink(uninterrupted(ctx), n.ino, req.NewName, req.Target, caller(&req.Header))
	if e != 0 {
		return nil, e
	}
	return n.fs.newNode(at), nil
}

// Readlink implements fs.NodeReadlinker.
func (n node) Readlink(ctx context.Context, _ *fuse.ReadlinkRequest) (string, error) {
	t, e := n.fs.ops.Readlink(uninterrupted(ctx), n.ino)
	return t, errOrNil(e)
}

// Link implements fs.NodeLinker.
func (n node) Link(ctx context.Context, req *fuse.LinkRequest, old fs.Node) (fs.Node, error) {
	on, ok := old.(node)
	if !ok {
		return nil, syscall.EXDEV
	}
	at, e := n.fs.ops.Link(uninterrupted(ctx), on.ino, n.ino, req.NewName)
	if e != 0 {
		return nil, e
	}
	return n.fs.newNode(at), nil
}

// Fsync implements fs.NodeFsyncer: it returns once this mount's writes to
// the file are committed. Directory changes are committed before their
// operations return, so a directory fsync has nothing to wait for.
func (n node) Fsync(ctx context.Context, req *fuse.FsyncRequest) error {
	if req.Dir {
		return nil
	}
	return errOrNil(n.fs.ops.Fsync(uninterrupted(ctx), n.ino))
}

// Getxattr implements fs.NodeGetxattrer; bazil answers ERANGE when the
// value does not fit the caller's buffer.
func (n node) Getxattr(ctx context.Context, req *fuse.GetxattrRequest, resp *fuse.GetxattrResponse) error {
	v, e := n.fs.ops.GetXattr(uninterrupted(ctx), n.ino, req.Name)
	if e != 0 {
		return e
	}
	resp.Xattr = v
	return nil
}

// Listxattr implements fs.NodeListxattrer.
func (n node) Listxattr(ctx context.Context, _ *fuse.ListxattrRequest, resp *fuse.ListxattrResponse) error {
	names, e := n.fs.ops.ListXattr(uninterrupted(ctx), n.ino)
	if e != 0 {
		return e
	}
	resp.Append(names...)
	return nil
}

// Setxattr implements fs.NodeSetxattrer.
func (n node) Setxattr(ctx context.Context, req *fuse.SetxattrRequest) error {
	return errOrNil(n.fs.ops.SetXattr(uninterrupted(ctx), n.ino, req.Name, req.Xattr, req.Flags))
}

// Removexattr implements fs.NodeRemovexattrer.
func (n node) Removexattr(ctx context.Context, req *fuse.RemovexattrRequest) error {
	return errOrNil(n.fs.ops.RemoveXattr(uninterrupted(ctx), n.ino, req.Name))
}

// Poll implements fs.NodePoller. The answer ENOSYS makes the kernel stop
// asking: the Go runtime registers every file it opens with epoll, which
// for a FUSE file is a POLL request per open, and the file system has no
// readiness to report.
func (n node) Poll(context.Context, *fuse.PollRequest, *fuse.PollResponse) error {
	return syscall.ENOSYS
}

// Poll implements fs.HandlePoller; see node.Poll.
func (h *fileHandle) Poll(context.Context, *fuse.PollRequest, *fuse.PollResponse) error {
	return syscall.ENOSYS
}

// fileHandle is one open regular file.
type fileHandle struct {
	fs  *FS
	ino uint64
	h   uint64
}

// Read implements fs.HandleReader, filling the buffer bazil allocated.
func (h *fileHandle) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	buf := resp.Data[:req.Size]
	n, e := h.fs.ops.Read(uninterrupted(ctx), h.ino, h.h, req.Offset, buf)
	if e != 0 {
		return e
	}
	resp.Data = buf[:n]
	return nil
}

// Write implements fs.HandleWriter. req.Data is reused once this returns;
// fsops copies what it keeps.
func (h *fileHandle) Write(ctx context.Context, req *fuse.WriteRequest, resp *fuse.WriteResponse) error {
	n, e := h.fs.ops.Write(uninterrupted(ctx), h.ino, h.h, req.Offset, req.Data)
	if e != 0 {
		return e
	}
	resp.Size = n
	return nil
}

// Flush implements fs.HandleFlusher (each close of a descriptor), which
// also ends the closing process's POSIX locks on the file.
func (h *fileHandle) Flush(ctx context.Context, req *fuse.FlushRequest) error {
	e := h.fs.ops.Flush(uninterrupted(ctx), h.ino, h.h)
	if le := h.fs.ops.ReleaseLocks(uninterrupted(ctx), h.ino, uint64(req.LockOwner), false); e == 0 {
		e = le
	}
	return errOrNil(e)
}

// Release implements fs.HandleReleaser (the last close), which also ends
// the open file's flock lock.
func (h *fileHandle) Release(ctx context.Context, req *fuse.ReleaseRequest) error {
	if req.ReleaseFlags&fuse.ReleaseFlockUnlock != 0 {
		_ = h.fs.ops.ReleaseLocks(uninterrupted(ctx), h.ino, uint64(req.LockOwner), true)
	}
	return errOrNil(h.fs.ops.Release(uninterrupted(ctx), h.ino, h.h))
}

// lockOf converts bazil's description of a lock request.
func lockOf(owner fuse.LockOwner, l fuse.FileLock, flags fuse.LockFlags) fsops.Lock {
	return fsops.Lock{
		Owner: uint64(owner), Type: uint32(l.Type), Start: l.Start, End: l.End,
		Pid: uint32(l.PID), Flock: flags&fuse.LockFlock != 0,
	}
}

// Lock implements fs.HandleLocker (F_SETLK, flock with LOCK_NB).
func (h *fileHandle) Lock(ctx context.Context, req *fuse.LockRequest) error {
	return errOrNil(h.fs.ops.SetLk(uninterrupted(ctx), h.ino, h.h, lockOf(req.LockOwner, req.Lock, req.LockFlags), false))
}

// LockWait implements fs.HandleLocker (F_SETLKW, flock). Unlike every
// other operation it lets the kernel's interrupt cancel it: a process
// waiting for a lock must be able to take a signal (EINTR).
func (h *fileHandle) LockWait(ctx context.Context, req *fuse.LockWaitRequest) error {
	return errOrNil(h.fs.ops.SetLk(ctx, h.ino, h.h, lockOf(req.LockOwner, req.Lock, req.LockFlags), true))
}

// Unlock implements fs.HandleLocker.
func (h *fileHandle) Unlock(ctx context.Context, req *fuse.UnlockRequest) error {
	return errOrNil(h.fs.ops.SetLk(uninterrupted(ctx), h.ino, h.h, lockOf(req.LockOwner, req.Lock, req.LockFlags), false))
}

// QueryLock implements fs.HandleLocker (F_GETLK).
func (h *fileHandle) QueryLock(ctx context.Context, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	lk, e := h.fs.ops.GetLk(uninterrupted(ctx), h.ino, h.h, lockOf(req.LockOwner, req.Lock, req.LockFlags))
	if e != 0 {
		return e
	}
	resp.Lock = fuse.FileLock{Start: lk.Start, End: lk.End, Type: fuse.LockType(lk.Type), PID: int32(lk.Pid)}
	return nil
}

// dirHandle is one open directory. bazil reads the whole listing when the
// offset is 0 (opendir, rewinddir) and serves later offsets from it; its
// offsets are byte positions in that listing, which bazil does not let a
// file system choose (a READDIR without ReadDirAll is answered empty). So
// an offset from telldir is valid in the listing it came from only: after
// a rewinddir and changes to the directory, seekdir to it may land on
// another entry, which the go-fuse binding's offsets (fsops.DirStream)
// do not.
type dirHandle struct {
	fs  *FS
	ino uint64
}

// ReadDirAll implements fs.HandleReadDirAller.
func (d *dirHandle) ReadDirAll(ctx context.Context) ([]fuse.Dirent, error) {
	ents, e := d.fs.ops.ReadDir(uninterrupted(ctx), d.ino)
	if e != 0 {
		return nil, e
	}
	out := make([]fuse.Dirent, len(ents))
	for i, de := range ents {
		out[i] = fuse.Dirent{Inode: de.Ino, Type: direntType(de.Mode), Name: de.Name}
	}
	return out, nil
}
