package mountmetrics

import (
	"context"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// Each method times the operation and counts its answer; the op label is
// the FUSE operation's name in lower case.

func (o measured) Lookup(ctx context.Context, parent uint64, name string) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("lookup", time.Now(), &e)
	return o.Ops.Lookup(ctx, parent, name)
}

func (o measured) GetAttr(ctx context.Context, ino uint64) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("getattr", time.Now(), &e)
	return o.Ops.GetAttr(ctx, ino)
}

func (o measured) SetAttr(ctx context.Context, ino uint64, in fsops.SetAttrIn) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("setattr", time.Now(), &e)
	return o.Ops.SetAttr(ctx, ino, in)
}

func (o measured) Access(ctx context.Context, ino uint64, mask uint32, c fsops.Caller) (e syscall.Errno) {
	defer o.m.observe("access", time.Now(), &e)
	return o.Ops.Access(ctx, ino, mask, c)
}

func (o measured) Open(ctx context.Context, ino uint64, flags int, c fsops.Caller) (r0 fsops.OpenOut, e syscall.Errno) {
	defer o.m.observe("open", time.Now(), &e)
	return o.Ops.Open(ctx, ino, flags, c)
}

func (o measured) Create(ctx context.Context, parent uint64, name string, flags int, mode uint32, c fsops.Caller) (r0 fsops.Attr, r1 fsops.OpenOut, e syscall.Errno) {
	defer o.m.observe("create", time.Now(), &e)
	return o.Ops.Create(ctx, parent, name, flags, mode, c)
}

func (o measured) Read(ctx context.Context, ino, handle uint64, off int64, dst []byte) (r0 int, e syscall.Errno) {
	defer o.m.observe("read", time.Now(), &e)
	return o.Ops.Read(ctx, ino, handle, off, dst)
}

func (o measured) Write(ctx context.Context, ino, handle uint64, off int64, data []byte) (r0 int, e syscall.Errno) {
	defer o.m.observe("write", time.Now(), &e)
	return o.Ops.Write(ctx, ino, handle, off, data)
}

func (o measured) Flush(ctx context.Context, ino, handle uint64) (e syscall.Errno) {
	defer o.m.observe("flush", time.Now(), &e)
	return o.Ops.Flush(ctx, ino, handle)
}

func (o measured) Lseek(ctx context.Context, ino, handle uint64, off int64, whence int) (r0 int64, e syscall.Errno) {
	defer o.m.observe("lseek", time.Now(), &e)
	return o.Ops.Lseek(ctx, ino, handle, off, whence)
}

func (o measured) Fsync(ctx context.Context, ino uint64) (e syscall.Errno) {
	defer o.m.observe("fsync", time.Now(), &e)
	return o.Ops.Fsync(ctx, ino)
}

func (o measured) Release(ctx context.Context, ino, handle uint64) (e syscall.Errno) {
	defer o.m.observe("release", time.Now(), &e)
	return o.Ops.Release(ctx, ino, handle)
}

func (o measured) ReadDir(ctx context.Context, ino uint64) (r0 []fsops.DirEntry, e syscall.Errno) {
	defer o.m.observe("readdir", time.Now(), &e)
	return o.Ops.ReadDir(ctx, ino)
}

func (o measured) ReadDirPlus(ctx context.Context, ino uint64) (r0 []fsops.DirEntry, e syscall.Errno) {
	defer o.m.observe("readdirplus", time.Now(), &e)
	return o.Ops.ReadDirPlus(ctx, ino)
}

func (o measured) Mknod(ctx context.Context, parent uint64, name string, mode, rdev uint32, c fsops.Caller) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("mknod", time.Now(), &e)
	return o.Ops.Mknod(ctx, parent, name, mode, rdev, c)
}

func (o measured) Mkdir(ctx context.Context, parent uint64, name string, mode uint32, c fsops.Caller) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("mkdir", time.Now(), &e)
	return o.Ops.Mkdir(ctx, parent, name, mode, c)
}

func (o measured) Rmdir(ctx context.Context, parent uint64, name string, c fsops.Caller) (e syscall.Errno) {
	defer o.m.observe("rmdir", time.Now(), &e)
	return o.Ops.Rmdir(ctx, parent, name, c)
}

func (o measured) Unlink(ctx context.Context, parent uint64, name string, c fsops.Caller) (e syscall.Errno) {
	defer o.m.observe("unlink", time.Now(), &e)
	return o.Ops.Unlink(ctx, parent, name, c)
}

func (o measured) Rename(ctx context.Context, parent uint64, name string, newParent uint64, newName string, c fsops.Caller) (e syscall.Errno) {
	defer o.m.observe("rename", time.Now(), &e)
	return o.Ops.Rename(ctx, parent, name, newParent, newName, c)
}

func (o measured) Symlink(ctx context.Context, parent uint64, name, target string, c fsops.Caller) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("symlink", time.Now(), &e)
	return o.Ops.Symlink(ctx, parent, name, target, c)
}

func (o measured) Readlink(ctx context.Context, ino uint64) (r0 string, e syscall.Errno) {
	defer o.m.observe("readlink", time.Now(), &e)
	return o.Ops.Readlink(ctx, ino)
}

func (o measured) Link(ctx context.Context, ino, newParent uint64, newName string) (r0 fsops.Attr, e syscall.Errno) {
	defer o.m.observe("link", time.Now(), &e)
	return o.Ops.Link(ctx, ino, newParent, newName)
}

func (o measured) GetXattr(ctx context.Context, ino uint64, name string) (r0 []byte, e syscall.Errno) {
	defer o.m.observe("getxattr", time.Now(), &e)
	return o.Ops.GetXattr(ctx, ino, name)
}

func (o measured) ListXattr(ctx context.Context, ino uint64) (r0 []string, e syscall.Errno) {
	defer o.m.observe("listxattr", time.Now(), &e)
	return o.Ops.ListXattr(ctx, ino)
}

func (o measured) SetXattr(ctx context.Context, ino uint64, name string, value []byte, flags uint32) (e syscall.Errno) {
	defer o.m.observe("setxattr", time.Now(), &e)
	return o.Ops.SetXattr(ctx, ino, name, value, flags)
}

func (o measured) RemoveXattr(ctx context.Context, ino uint64, name string) (e syscall.Errno) {
	defer o.m.observe("removexattr", time.Now(), &e)
	return o.Ops.RemoveXattr(ctx, ino, name)
}

func (o measured) Statfs(ctx context.Context) (r0 fsops.StatfsOut, e syscall.Errno) {
	defer o.m.observe("statfs", time.Now(), &e)
	return o.Ops.Statfs(ctx)
}
