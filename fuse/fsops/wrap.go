package fsops

import (
	"context"
	"log/slog"
	"runtime/debug"
	"syscall"
	"time"
)

// Observer is told each operation's name (the FUSE operation's in lower
// case), when it began and its answer.
type Observer func(op string, start time.Time, e syscall.Errno)

// Wrap returns ops with what every operation needs around it, in one
// place rather than in each method: a panic is recovered, logged with its
// stack and answered EIO, so a bug fails one request instead of the
// mount; and observe, when not nil, is told of every operation (the
// mount's metrics). A method Ops gains must get its line here too
// (TestWrapCoversEveryOperation fails until it does).
func Wrap(ops Ops, observe Observer) Ops { return wrapped{Ops: ops, observe: observe} }

type wrapped struct {
	Ops
	observe Observer
}

// end is deferred by every method: recover works only in the deferred
// function itself.
func (w wrapped) end(op string, start time.Time, e *syscall.Errno) {
	if r := recover(); r != nil {
		slog.Error("fuse: panic in operation", "op", op, "panic", r, "stack", string(debug.Stack()))
		*e = syscall.EIO
	}
	if w.observe != nil {
		w.observe(op, start, *e)
	}
}

func (w wrapped) Lookup(ctx context.Context, parent uint64, name string) (r0 Attr, e syscall.Errno) {
	defer w.end("lookup", time.Now(), &e)
	return w.Ops.Lookup(ctx, parent, name)
}

func (w wrapped) GetAttr(ctx context.Context, ino uint64) (r0 Attr, e syscall.Errno) {
	defer w.end("getattr", time.Now(), &e)
	return w.Ops.GetAttr(ctx, ino)
}

func (w wrapped) SetAttr(ctx context.Context, ino uint64, in SetAttrIn) (r0 Attr, e syscall.Errno) {
	defer w.end("setattr", time.Now(), &e)
	return w.Ops.SetAttr(ctx, ino, in)
}

func (w wrapped) Access(ctx context.Context, ino uint64, mask uint32, c Caller) (e syscall.Errno) {
	defer w.end("access", time.Now(), &e)
	return w.Ops.Access(ctx, ino, mask, c)
}

func (w wrapped) Open(ctx context.Context, ino uint64, flags int, c Caller) (r0 OpenOut, e syscall.Errno) {
	defer w.end("open", time.Now(), &e)
	return w.Ops.Open(ctx, ino, flags, c)
}

func (w wrapped) Create(ctx context.Context, parent uint64, name string, flags int, mode uint32, c Caller) (r0 Attr, r1 OpenOut, e syscall.Errno) {
	defer w.end("create", time.Now(), &e)
	return w.Ops.Create(ctx, parent, name, flags, mode, c)
}

func (w wrapped) Read(ctx context.Context, ino, handle uint64, off int64, dst []byte) (r0 int, e syscall.Errno) {
	defer w.end("read", time.Now(), &e)
	return w.Ops.Read(ctx, ino, handle, off, dst)
}

func (w wrapped) Write(ctx context.Context, ino, handle uint64, off int64, data []byte) (r0 int, e syscall.Errno) {
	defer w.end("write", time.Now(), &e)
	return w.Ops.Write(ctx, ino, handle, off, data)
}

func (w wrapped) Flush(ctx context.Context, ino, handle uint64) (e syscall.Errno) {
	defer w.end("flush", time.Now(), &e)
	return w.Ops.Flush(ctx, ino, handle)
}

func (w wrapped) Lseek(ctx context.Context, ino, handle uint64, off int64, whence int) (r0 int64, e syscall.Errno) {
	defer w.end("lseek", time.Now(), &e)
	return w.Ops.Lseek(ctx, ino, handle, off, whence)
}

func (w wrapped) Fsync(ctx context.Context, ino uint64) (e syscall.Errno) {
	defer w.end("fsync", time.Now(), &e)
	return w.Ops.Fsync(ctx, ino)
}

func (w wrapped) Release(ctx context.Context, ino, handle uint64) (e syscall.Errno) {
	defer w.end("release", time.Now(), &e)
	return w.Ops.Release(ctx, ino, handle)
}

func (w wrapped) ReadDir(ctx context.Context, ino uint64) (r0 []DirEntry, e syscall.Errno) {
	defer w.end("readdir", time.Now(), &e)
	return w.Ops.ReadDir(ctx, ino)
}

func (w wrapped) ReadDirPlus(ctx context.Context, ino uint64) (r0 []DirEntry, e syscall.Errno) {
	defer w.end("readdirplus", time.Now(), &e)
	return w.Ops.ReadDirPlus(ctx, ino)
}

func (w wrapped) Mknod(ctx context.Context, parent uint64, name string, mode, rdev uint32, c Caller) (r0 Attr, e syscall.Errno) {
	defer w.end("mknod", time.Now(), &e)
	return w.Ops.Mknod(ctx, parent, name, mode, rdev, c)
}

func (w wrapped) Mkdir(ctx context.Context, parent uint64, name string, mode uint32, c Caller) (r0 Attr, e syscall.Errno) {
	defer w.end("mkdir", time.Now(), &e)
	return w.Ops.Mkdir(ctx, parent, name, mode, c)
}

func (w wrapped) Rmdir(ctx context.Context, parent uint64, name string, c Caller) (e syscall.Errno) {
	defer w.end("rmdir", time.Now(), &e)
	return w.Ops.Rmdir(ctx, parent, name, c)
}

func (w wrapped) Unlink(ctx context.Context, parent uint64, name string, c Caller) (e syscall.Errno) {
	defer w.end("unlink", time.Now(), &e)
	return w.Ops.Unlink(ctx, parent, name, c)
}

func (w wrapped) Rename(ctx context.Context, parent uint64, name string, newParent uint64, newName string, c Caller) (e syscall.Errno) {
	defer w.end("rename", time.Now(), &e)
	return w.Ops.Rename(ctx, parent, name, newParent, newName, c)
}

func (w wrapped) Symlink(ctx context.Context, parent uint64, name, target string, c Caller) (r0 Attr, e syscall.Errno) {
	defer w.end("symlink", time.Now(), &e)
	return w.Ops.Symlink(ctx, parent, name, target, c)
}

func (w wrapped) Readlink(ctx context.Context, ino uint64) (r0 string, e syscall.Errno) {
	defer w.end("readlink", time.Now(), &e)
	return w.Ops.Readlink(ctx, ino)
}

func (w wrapped) Link(ctx context.Context, ino, newParent uint64, newName string) (r0 Attr, e syscall.Errno) {
	defer w.end("link", time.Now(), &e)
	return w.Ops.Link(ctx, ino, newParent, newName)
}

func (w wrapped) GetXattr(ctx context.Context, ino uint64, name string) (r0 []byte, e syscall.Errno) {
	defer w.end("getxattr", time.Now(), &e)
	return w.Ops.GetXattr(ctx, ino, name)
}

func (w wrapped) ListXattr(ctx context.Context, ino uint64) (r0 []string, e syscall.Errno) {
	defer w.end("listxattr", time.Now(), &e)
	return w.Ops.ListXattr(ctx, ino)
}

func (w wrapped) SetXattr(ctx context.Context, ino uint64, name string, value []byte, flags uint32) (e syscall.Errno) {
	defer w.end("setxattr", time.Now(), &e)
	return w.Ops.SetXattr(ctx, ino, name, value, flags)
}

func (w wrapped) RemoveXattr(ctx context.Context, ino uint64, name string) (e syscall.Errno) {
	defer w.end("removexattr", time.Now(), &e)
	return w.Ops.RemoveXattr(ctx, ino, name)
}

func (w wrapped) Statfs(ctx context.Context) (r0 StatfsOut, e syscall.Errno) {
	defer w.end("statfs", time.Now(), &e)
	return w.Ops.Statfs(ctx)
}

func (w wrapped) GetLk(ctx context.Context, ino, handle uint64, lk Lock) (r0 Lock, e syscall.Errno) {
	defer w.end("getlk", time.Now(), &e)
	return w.Ops.GetLk(ctx, ino, handle, lk)
}

func (w wrapped) SetLk(ctx context.Context, ino, handle uint64, lk Lock, wait bool) (e syscall.Errno) {
	defer w.end("setlk", time.Now(), &e)
	return w.Ops.SetLk(ctx, ino, handle, lk, wait)
}

func (w wrapped) ReleaseLocks(ctx context.Context, ino, owner uint64, flock bool) (e syscall.Errno) {
	defer w.end("releaselocks", time.Now(), &e)
	return w.Ops.ReleaseLocks(ctx, ino, owner, flock)
}
