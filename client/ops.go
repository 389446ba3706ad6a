package client

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// This file is the path-based API, shaped after package os. Paths are
// absolute in the cluster's tree; a relative one is taken from the root.
// Every method runs under the Client's context (see WithContext).

// do runs cmd and reports an error as op on name.
func (c *Client) do(op, name string, cmd *pb.Command) (*pb.Result, error) {
	res, err := c.Do(c.ctx, cmd)
	return res, withPath(err, op, name)
}

func (c *Client) ask(op, name string, q *pb.Query) (*pb.Result, error) {
	res, err := c.Query(c.ctx, q)
	return res, withPath(err, op, name)
}

// Mkdir creates the directory name with permission bits perm.
func (c *Client) Mkdir(name string, perm fs.FileMode) error {
	_, err := c.do("mkdir", name, &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{
		Loc: &pb.Loc{Path: clean(name)}, Mode: modeBits(perm), Uid: c.k.cfg.uid, Gid: c.k.cfg.gid,
	}}})
	return err
}

// Mknod creates name as a FIFO (fs.ModeNamedPipe), a Unix socket
// (fs.ModeSocket), a character (fs.ModeDevice|fs.ModeCharDevice) or block
// device (fs.ModeDevice) with device number dev (Linux encoding,
// unix.Mkdev), or an empty regular file. The cluster keeps its name, type
// and attributes; only a mount's kernel opens a special file.
func (c *Client) Mknod(name string, mode fs.FileMode, dev uint64) error {
	var typ uint32
	switch {
	case mode&fs.ModeNamedPipe != 0:
		typ = sIFIFO
	case mode&fs.ModeSocket != 0:
		typ = sIFSOCK
	case mode&fs.ModeCharDevice != 0:
		typ = sIFCHR
	case mode&fs.ModeDevice != 0:
		typ = sIFBLK
	case mode&fs.ModeType != 0:
		return &fs.PathError{Op: "mknod", Path: name, Err: syscall.EINVAL}
	}
	_, err := c.do("mknod", name, &pb.Command{Op: &pb.Command_Mknod{Mknod: &pb.MknodCmd{
		Loc: &pb.Loc{Path: clean(name)}, Mode: typ | modeBits(mode), Rdev: dev, Uid: c.k.cfg.uid, Gid: c.k.cfg.gid,
	}}})
	return err
}

// MkdirAll creates name and any missing parents; an existing directory is
// not an error.
func (c *Client) MkdirAll(name string, perm fs.FileMode) error {
	p := clean(name)
	if fi, err := c.Stat(p); err == nil {
		if fi.IsDir() {
			return nil
		}
		return pathErr("mkdir", name, syscall.ENOTDIR)
	}
	if parent := path.Dir(p); parent != p {
		if err := c.MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	err := c.Mkdir(p, perm)
	if err != nil && errors.Is(err, fs.ErrExist) {
		// Made meanwhile by someone else; fine if it is a directory.
		if fi, serr := c.Lstat(p); serr == nil && fi.IsDir() {
			return nil
		}
	}
	return withPath(err, "mkdir", name)
}

// Remove removes a file, symlink or empty directory.
func (c *Client) Remove(name string) error {
	_, err := c.do("remove", name, &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{
		Loc: &pb.Loc{Path: clean(name), Nofollow: true},
	}}})
	return err
}

// RemoveAll removes name and everything under it. A missing name is not an
// error. It is not atomic: entries created meanwhile may make it fail.
func (c *Client) RemoveAll(name string) error { return c.RemoveAllFunc(name, nil) }

// RemoveAllFunc is RemoveAll calling removed, when not nil, after each
// name it removed (for a progress display).
func (c *Client) RemoveAllFunc(name string, removed func(name string)) error {
	err := c.Remove(name)
	if err == nil {
		if removed != nil {
			removed(name)
		}
		return nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	fi, lerr := c.Lstat(name)
	if errors.Is(lerr, fs.ErrNotExist) {
		return nil
	}
	if lerr != nil || !fi.IsDir() {
		return err
	}
	ents, rerr := c.ReadDir(name)
	if rerr != nil {
		return rerr
	}
	p := clean(name)
	for _, e := range ents {
		if err := c.RemoveAllFunc(path.Join(p, e.Name()), removed); err != nil {
			return err
		}
	}
	if err := c.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if removed != nil {
		removed(name)
	}
	return nil
}

// Rename moves oldname to newname, replacing newname if it exists (and,
// for a directory, is empty).
func (c *Client) Rename(oldname, newname string) error {
	_, err := c.Do(c.ctx, &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{
		Src: &pb.Loc{Path: clean(oldname), Nofollow: true},
		Dst: &pb.Loc{Path: clean(newname), Nofollow: true},
	}}})
	return linkErr("rename", oldname, newname, unwrapPath(err))
}

// unwrapPath returns the error inside an *fs.PathError, for errors that
// name two paths.
func unwrapPath(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// ReadDir lists directory name, sorted by name.
func (c *Client) ReadDir(name string) ([]fs.DirEntry, error) {
	ents, err := c.listDir(c.ctx, &pb.Loc{Path: clean(name)})
	return ents, withPath(err, "readdir", name)
}

// Stat returns the attributes of name, following symlinks. Sys() of the
// result is the *pb.Attr.
func (c *Client) Stat(name string) (fs.FileInfo, error) {
	return c.statInfo(c.ctx, "stat", name, false)
}

// Lstat is Stat without following a symlink in the last component.
func (c *Client) Lstat(name string) (fs.FileInfo, error) {
	return c.statInfo(c.ctx, "lstat", name, true)
}

func (c *Client) statInfo(ctx context.Context, op, name string, nofollow bool) (fs.FileInfo, error) {
	p := clean(name)
	a, err := c.stat(ctx, op, &pb.Loc{Path: p, Nofollow: nofollow})
	if err != nil {
		return nil, withPath(err, op, name)
	}
	return fileInfo{name: path.Base(p), a: a}, nil
}

// Symlink creates newname as a symbolic link to oldname.
func (c *Client) Symlink(oldname, newname string) error {
	_, err := c.Do(c.ctx, &pb.Command{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{
		Loc: &pb.Loc{Path: clean(newname)}, Target: oldname, Uid: c.k.cfg.uid, Gid: c.k.cfg.gid,
	}}})
	return linkErr("symlink", oldname, newname, unwrapPath(err))
}

// Readlink returns the target of symlink name.
func (c *Client) Readlink(name string) (string, error) {
	res, err := c.ask("readlink", name, &pb.Query{Q: &pb.Query_Readlink{Readlink: &pb.ReadlinkQuery{
		Loc: &pb.Loc{Path: clean(name), Nofollow: true},
	}}})
	if err != nil {
		return "", err
	}
	return res.GetTarget(), nil
}

// Link creates newname as a hard link to the file oldname.
func (c *Client) Link(oldname, newname string) error {
	_, err := c.Do(c.ctx, &pb.Command{Op: &pb.Command_Link{Link: &pb.LinkCmd{
		Src: &pb.Loc{Path: clean(oldname), Nofollow: true}, Dst: &pb.Loc{Path: clean(newname)},
	}}})
	return linkErr("link", oldname, newname, unwrapPath(err))
}

func (c *Client) setAttr(op, name string, set *pb.SetAttrCmd) error {
	set.Loc = &pb.Loc{Path: clean(name)}
	_, err := c.do(op, name, &pb.Command{Op: &pb.Command_SetAttr{SetAttr: set}})
	return err
}

// Chmod sets the permission bits (and setuid, setgid, sticky) of name.
func (c *Client) Chmod(name string, mode fs.FileMode) error {
	return c.setAttr("chmod", name, &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_MODE), Mode: modeBits(mode)})
}

// Chown sets the owner of name; -1 leaves uid or gid as it is.
func (c *Client) Chown(name string, uid, gid int) error {
	set := &pb.SetAttrCmd{}
	if uid >= 0 {
		set.Valid |= uint32(pb.SetAttrBit_SET_UID)
		set.Uid = uint32(uid)
	}
	if gid >= 0 {
		set.Valid |= uint32(pb.SetAttrBit_SET_GID)
		set.Gid = uint32(gid)
	}
	return c.setAttr("chown", name, set)
}

// Chtimes sets the access and modification times of name; a zero
// time.Time leaves that time as it is.
func (c *Client) Chtimes(name string, atime, mtime time.Time) error {
	set := &pb.SetAttrCmd{}
	if !atime.IsZero() {
		set.Valid |= uint32(pb.SetAttrBit_SET_ATIME)
		set.AtimeNs = atime.UnixNano()
	}
	if !mtime.IsZero() {
		set.Valid |= uint32(pb.SetAttrBit_SET_MTIME)
		set.MtimeNs = mtime.UnixNano()
	}
	return c.setAttr("chtimes", name, set)
}

// Truncate changes the size of file name.
func (c *Client) Truncate(name string, size int64) error {
	return c.setAttr("truncate", name, &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_SIZE), Size: size})
}

// Extended attribute flags for Setxattr, as in setxattr(2).
const (
	XattrCreate  = 1 // fail with EEXIST if the attribute exists
	XattrReplace = 2 // fail with ENODATA if it does not
)

// Setxattr sets extended attribute attr of name to data.
func (c *Client) Setxattr(name, attr string, data []byte, flags int) error {
	_, err := c.do("setxattr", name, &pb.Command{Op: &pb.Command_SetXattr{SetXattr: &pb.SetXattrCmd{
		Loc: &pb.Loc{Path: clean(name)}, Name: attr, Value: data, Flags: uint32(flags),
	}}})
	return err
}

// Getxattr returns extended attribute attr of name.
func (c *Client) Getxattr(name, attr string) ([]byte, error) {
	res, err := c.ask("getxattr", name, &pb.Query{Q: &pb.Query_GetXattr{GetXattr: &pb.GetXattrQuery{
		Loc: &pb.Loc{Path: clean(name)}, Name: attr,
	}}})
	if err != nil {
		return nil, err
	}
	return res.GetData(), nil
}

// Listxattr returns the names of the extended attributes of name.
func (c *Client) Listxattr(name string) ([]string, error) {
	res, err := c.ask("listxattr", name, &pb.Query{Q: &pb.Query_ListXattr{ListXattr: &pb.ListXattrQuery{
		Loc: &pb.Loc{Path: clean(name)},
	}}})
	if err != nil {
		return nil, err
	}
	return res.GetNames(), nil
}

// Removexattr removes extended attribute attr of name.
func (c *Client) Removexattr(name, attr string) error {
	_, err := c.do("removexattr", name, &pb.Command{Op: &pb.Command_RemoveXattr{RemoveXattr: &pb.RemoveXattrCmd{
		Loc: &pb.Loc{Path: clean(name)}, Name: attr,
	}}})
	return err
}

// ReadFile returns the contents of file name. A file of up to
// pb.MaxMessageData takes one round trip.
func (c *Client) ReadFile(name string) ([]byte, error) {
	return c.readFile(c.ctx, "read", name)
}

func (c *Client) readFile(ctx context.Context, op, name string) ([]byte, error) {
	loc := &pb.Loc{Path: clean(name)}
	// The first answer's bytes are the result when they are the whole
	// file: a small file costs no buffer of MaxMessageData.
	buf, eof, err := c.k.readData(ctx, &pb.ReadQuery{Loc: loc, Length: pb.MaxMessageData})
	n := len(buf)
	for err == nil && !eof {
		// Larger than one message: size the buffer from the file and read
		// the rest in as few streams as possible.
		var a *pb.Attr
		if a, err = c.stat(ctx, op, loc); err != nil {
			break
		}
		if size := int(a.GetSize()); size+1 > len(buf) {
			buf = append(buf[:n], make([]byte, size+1-n)...)
		} else {
			buf = append(buf[:n], make([]byte, pb.MaxMessageData)...)
		}
		var got int
		got, err = c.k.read(ctx, &pb.ReadQuery{Loc: loc, Offset: int64(n)}, buf[n:])
		n += got
		eof = n < len(buf)
	}
	if err != nil {
		return nil, withPath(err, op, name)
	}
	return buf[:n:n], nil
}

// WriteFile writes data to file name, creating it with perm if needed and
// truncating it first. It returns once the data is committed.
func (c *Client) WriteFile(name string, data []byte, perm fs.FileMode) error {
	ctx := c.ctx
	loc := &pb.Loc{Path: clean(name)}
	if len(data) <= pb.MaxMessageData {
		// Small files go as one command: create, truncate and write in one
		// log entry, one commit round.
		_, err := c.Do(ctx, &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: loc, Data: data, Create: true, Truncate: true,
			Mode: modeBits(perm), Uid: c.k.cfg.uid, Gid: c.k.cfg.gid,
		}}})
		return withPath(err, "write", name)
	}
	h, attr, err := c.OpenLoc(ctx, loc, linuxFlags(os.O_WRONLY|os.O_CREATE|os.O_TRUNC), modeBits(perm), c.k.cfg.uid, c.k.cfg.gid, false, false)
	if err != nil {
		return withPath(err, "open", name)
	}
	if len(data) == 0 {
		return withPath(c.CloseHandle(ctx, h), "close", name)
	}
	// The write goes by inode, so it needs no handle and can run alongside
	// the close: one round trip less per file.
	var wg sync.WaitGroup
	var cerr error
	wg.Go(func() { cerr = c.CloseHandle(ctx, h) })
	_, _, werr := c.WriteIno(ctx, attr.GetIno(), 0, data)
	wg.Wait()
	if werr != nil {
		return withPath(werr, "write", name)
	}
	return withPath(cerr, "close", name)
}

// Clone copies src to dst by sharing its blocks (copy-on-write); a
// directory is copied with everything under it.
func (c *Client) Clone(src, dst string) error {
	fi, err := c.Lstat(src)
	if err != nil {
		return linkErr("clone", src, dst, unwrapPath(err))
	}
	_, err = c.Do(c.ctx, &pb.Command{Op: &pb.Command_Clone{Clone: &pb.CloneCmd{
		Src: &pb.Loc{Path: clean(src), Nofollow: true}, Dst: &pb.Loc{Path: clean(dst)}, Recursive: fi.IsDir(),
	}}})
	return linkErr("clone", src, dst, unwrapPath(err))
}

// Usage returns the dedup accounting of the tree at name: files, logical
// bytes, and the physical bytes its blocks take.
func (c *Client) Usage(name string) (*pb.TreeUsage, error) {
	res, err := c.ask("usage", name, &pb.Query{Q: &pb.Query_Usage{Usage: &pb.UsageQuery{Loc: &pb.Loc{Path: clean(name)}}}})
	if err != nil {
		return nil, err
	}
	return res.GetUsage(), nil
}
