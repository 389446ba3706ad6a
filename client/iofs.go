package client

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"sync"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// FS returns a read-only io/fs view of the cluster's tree, running every
// call under ctx. Names are io/fs names ("a/b", "." for the root). Opening
// a file costs one read and no log entry: files are read by inode, without
// a handle. It implements fs.ReadDirFS, fs.StatFS, fs.ReadFileFS and
// fs.ReadLinkFS.
func (c *Client) FS(ctx context.Context) fs.FS {
	return &fsys{c: c.WithContext(ctx)}
}

type fsys struct{ c *Client }

var (
	_ fs.ReadDirFS  = (*fsys)(nil)
	_ fs.StatFS     = (*fsys)(nil)
	_ fs.ReadFileFS = (*fsys)(nil)
	_ fs.ReadLinkFS = (*fsys)(nil)
)

// abs checks an io/fs name and returns the cluster path for it.
func (f *fsys) abs(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return clean(name), nil
}

func (f *fsys) Open(name string) (fs.File, error) {
	p, err := f.abs("open", name)
	if err != nil {
		return nil, err
	}
	a, err := f.c.stat(f.c.ctx, "open", &pb.Loc{Path: p})
	if err != nil {
		return nil, withPath(err, "open", name)
	}
	info := fileInfo{name: path.Base(p), a: a}
	if info.IsDir() {
		return &fsDir{c: f.c, name: name, info: info}, nil
	}
	return &fsFile{c: f.c, name: name, info: info}, nil
}

func (f *fsys) Stat(name string) (fs.FileInfo, error) {
	p, err := f.abs("stat", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.c.statInfo(f.c.ctx, "stat", p, false)
	return fi, withPath(err, "stat", name)
}

func (f *fsys) Lstat(name string) (fs.FileInfo, error) {
	p, err := f.abs("lstat", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.c.statInfo(f.c.ctx, "lstat", p, true)
	return fi, withPath(err, "lstat", name)
}

func (f *fsys) ReadLink(name string) (string, error) {
	p, err := f.abs("readlink", name)
	if err != nil {
		return "", err
	}
	t, err := f.c.Readlink(p)
	return t, withPath(err, "readlink", name)
}

func (f *fsys) ReadDir(name string) ([]fs.DirEntry, error) {
	p, err := f.abs("readdir", name)
	if err != nil {
		return nil, err
	}
	ents, err := f.c.listDir(f.c.ctx, &pb.Loc{Path: p})
	return ents, withPath(err, "readdir", name)
}

func (f *fsys) ReadFile(name string) ([]byte, error) {
	p, err := f.abs("readfile", name)
	if err != nil {
		return nil, err
	}
	return f.c.readFile(f.c.ctx, "readfile", p)
}

// fsFile is a regular file of an FS, read by inode.
type fsFile struct {
	c    *Client
	name string
	info fileInfo

	mu     sync.Mutex // guards off and closed
	off    int64
	closed bool
}

func (f *fsFile) Stat() (fs.FileInfo, error) { return f.info, nil }

func (f *fsFile) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrClosed}
	}
	n, err := f.readAt(p, f.off)
	f.off += int64(n)
	if n > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

func (f *fsFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	return f.readAt(p, off)
}

func (f *fsFile) readAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := f.c.ReadIno(f.c.ctx, f.info.a.GetIno(), off, p)
	if err != nil {
		return n, withPath(err, "read", f.name)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *fsFile) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch whence {
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += f.info.Size()
	case io.SeekStart:
	default:
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: fs.ErrInvalid}
	}
	if offset < 0 {
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: fs.ErrInvalid}
	}
	f.off = offset
	return offset, nil
}

func (f *fsFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	return nil
}

// fsDir is a directory of an FS.
type fsDir struct {
	c    *Client
	name string
	info fileInfo

	mu     sync.Mutex // guards dir and closed
	dir    dirReader
	closed bool
}

func (d *fsDir) Stat() (fs.FileInfo, error) { return d.info, nil }

func (d *fsDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.name, Err: syscall.EISDIR}
}

func (d *fsDir) ReadDir(n int) ([]fs.DirEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, &fs.PathError{Op: "readdir", Path: d.name, Err: fs.ErrClosed}
	}
	ents, err := d.dir.readDir(n, func() ([]fs.DirEntry, error) {
		return d.c.listDir(d.c.ctx, &pb.Loc{Ino: d.info.a.GetIno()})
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return ents, withPath(err, "readdir", d.name)
	}
	return ents, err
}

func (d *fsDir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return &fs.PathError{Op: "close", Path: d.name, Err: fs.ErrClosed}
	}
	d.closed = true
	return nil
}
