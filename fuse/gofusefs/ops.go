package gofusefs

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// Lookup implements fuse.RawFileSystem. A missing name is cached by the
// kernel (a negative entry) only while the change stream is open and no
// round of change events passed during the lookup, so that the answer does
// not undo an invalidation sent while it was being looked up. An event in
// the instant between that check and the kernel taking the answer is
// bounded by the timeout, as for every cached entry.
func (f *FS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	gen := f.gen.Load()
	watching := f.cfg.Watching()
	a, e := f.ops.Lookup(ctx(), h.NodeId, name)
	if e == syscall.ENOENT && watching && f.cfg.Watching() && f.gen.Load() == gen {
		out.NodeId = 0
		out.SetEntryTimeout(f.timeout(fsops.Attr{Ino: h.NodeId}))
		return fuse.OK
	}
	return f.entryResult(out, a, e)
}

// GetAttr implements fuse.RawFileSystem.
func (f *FS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	a, e := f.ops.GetAttr(ctx(), in.NodeId)
	return f.attrResult(out, a, e)
}

func (f *FS) attrResult(out *fuse.AttrOut, a fsops.Attr, e syscall.Errno) fuse.Status {
	if e != 0 {
		return status(e)
	}
	out.SetTimeout(f.timeout(a))
	fillAttr(&out.Attr, a)
	return fuse.OK
}

// SetAttr implements fuse.RawFileSystem (chmod, chown, truncate, utimens).
func (f *FS) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	v := in.Valid
	has := func(bit uint32) bool { return v&bit != 0 }
	sa := fsops.SetAttrIn{
		SetMode: has(fuse.FATTR_MODE), SetUid: has(fuse.FATTR_UID), SetGid: has(fuse.FATTR_GID),
		SetSize:  has(fuse.FATTR_SIZE),
		SetAtime: has(fuse.FATTR_ATIME) || has(fuse.FATTR_ATIME_NOW),
		SetMtime: has(fuse.FATTR_MTIME) || has(fuse.FATTR_MTIME_NOW),
		AtimeNow: has(fuse.FATTR_ATIME_NOW), MtimeNow: has(fuse.FATTR_MTIME_NOW),
		Mode: in.Mode & 0o7777, Uid: in.Uid, Gid: in.Gid, Size: in.Size,
	}
	if t, ok := in.GetATime(); ok {
		sa.Atime = t
	}
	if t, ok := in.GetMTime(); ok {
		sa.Mtime = t
	}
	if fh, ok := in.GetFh(); ok {
		sa.Handle = fh
	}
	a, e := f.ops.SetAttr(ctx(), in.NodeId, sa)
	return f.attrResult(out, a, e)
}

// Access implements fuse.RawFileSystem. With default_permissions the
// kernel checks modes itself and rarely asks.
func (f *FS) Access(_ <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	return status(f.ops.Access(ctx(), in.NodeId, in.Mask, caller(&in.InHeader)))
}

// Mknod implements fuse.RawFileSystem.
func (f *FS) Mknod(_ <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	a, e := f.ops.Mknod(ctx(), in.NodeId, name, in.Mode, in.Rdev, caller(&in.InHeader))
	return f.entryResult(out, a, e)
}

// Mkdir implements fuse.RawFileSystem.
func (f *FS) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	a, e := f.ops.Mkdir(ctx(), in.NodeId, name, in.Mode&0o7777, caller(&in.InHeader))
	return f.entryResult(out, a, e)
}

// Unlink implements fuse.RawFileSystem.
func (f *FS) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return status(f.ops.Unlink(ctx(), h.NodeId, name, caller(h)))
}

// Rmdir implements fuse.RawFileSystem.
func (f *FS) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return status(f.ops.Rmdir(ctx(), h.NodeId, name, caller(h)))
}

// Rename implements fuse.RawFileSystem. renameat2's flags are not
// supported by the cluster: EINVAL, as the bazil binding gets from the
// kernel (RENAME_NOREPLACE onto an existing name is EEXIST, checked by the
// kernel before it asks).
func (f *FS) Rename(_ <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if in.Flags != 0 {
		return fuse.EINVAL
	}
	return status(f.ops.Rename(ctx(), in.NodeId, oldName, in.Newdir, newName, caller(&in.InHeader)))
}

// Link implements fuse.RawFileSystem.
func (f *FS) Link(_ <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	a, e := f.ops.Link(ctx(), in.Oldnodeid, in.NodeId, name)
	return f.entryResult(out, a, e)
}

// Symlink implements fuse.RawFileSystem.
func (f *FS) Symlink(_ <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	a, e := f.ops.Symlink(ctx(), h.NodeId, name, target, caller(h))
	return f.entryResult(out, a, e)
}

// Readlink implements fuse.RawFileSystem.
func (f *FS) Readlink(_ <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t, e := f.ops.Readlink(ctx(), h.NodeId)
	if e != 0 {
		return nil, status(e)
	}
	return []byte(t), fuse.OK
}

// GetXAttr implements fuse.RawFileSystem: with an empty buffer the size,
// ERANGE when the value does not fit.
func (f *FS) GetXAttr(_ <-chan struct{}, h *fuse.InHeader, name string, dest []byte) (uint32, fuse.Status) {
	v, e := f.ops.GetXattr(ctx(), h.NodeId, name)
	if e != 0 {
		return 0, status(e)
	}
	return fitInto(dest, v)
}

// ListXAttr implements fuse.RawFileSystem: names separated by NUL.
func (f *FS) ListXAttr(_ <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	names, e := f.ops.ListXattr(ctx(), h.NodeId)
	if e != 0 {
		return 0, status(e)
	}
	var b []byte
	for _, n := range names {
		b = append(append(b, n...), 0)
	}
	return fitInto(dest, b)
}

// fitInto copies v into dest, or reports the size needed.
func fitInto(dest, v []byte) (uint32, fuse.Status) {
	switch {
	case len(dest) == 0:
		return uint32(len(v)), fuse.OK
	case len(dest) < len(v):
		return uint32(len(v)), fuse.ERANGE
	}
	return uint32(copy(dest, v)), fuse.OK
}

// SetXAttr implements fuse.RawFileSystem.
func (f *FS) SetXAttr(_ <-chan struct{}, in *fuse.SetXAttrIn, name string, data []byte) fuse.Status {
	return status(f.ops.SetXattr(ctx(), in.NodeId, name, data, in.Flags))
}

// RemoveXAttr implements fuse.RawFileSystem.
func (f *FS) RemoveXAttr(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return status(f.ops.RemoveXattr(ctx(), h.NodeId, name))
}

// StatFs implements fuse.RawFileSystem.
func (f *FS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	st, e := f.ops.Statfs(ctx())
	if e != 0 {
		return status(e)
	}
	out.Bsize, out.Frsize = st.BlockSize, st.BlockSize
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.BlocksFree, st.BlocksFree
	out.Files, out.Ffree = st.Files+st.FilesFree, st.FilesFree
	out.NameLen = st.NameLen
	return fuse.OK
}
