package client

import (
	"context"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Linux file type and mode bits, which Attr.mode carries on every OS.
const (
	sIFMT   = 0o170000
	sIFDIR  = 0o040000
	sIFREG  = 0o100000
	sIFLNK  = 0o120000
	sIFIFO  = 0o010000
	sIFSOCK = 0o140000
	sIFCHR  = 0o020000
	sIFBLK  = 0o060000
	sISUID  = 0o4000
	sISGID  = 0o2000
	sISVTX  = 0o1000
	permSet = 0o777
)

// FileMode converts a wire mode (type and permission bits) to an
// fs.FileMode.
func FileMode(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & permSet)
	switch mode & sIFMT {
	case sIFDIR:
		m |= fs.ModeDir
	case sIFLNK:
		m |= fs.ModeSymlink
	case sIFIFO:
		m |= fs.ModeNamedPipe
	case sIFSOCK:
		m |= fs.ModeSocket
	case sIFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case sIFBLK:
		m |= fs.ModeDevice
	case sIFREG:
	default:
		m |= fs.ModeIrregular
	}
	if mode&sISUID != 0 {
		m |= fs.ModeSetuid
	}
	if mode&sISGID != 0 {
		m |= fs.ModeSetgid
	}
	if mode&sISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// modeBits converts the permission part of an fs.FileMode to wire bits.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= sISUID
	}
	if m&fs.ModeSetgid != 0 {
		b |= sISGID
	}
	if m&fs.ModeSticky != 0 {
		b |= sISVTX
	}
	return b
}

// fileInfo is an fs.FileInfo over an Attr; Sys returns the *pb.Attr.
type fileInfo struct {
	name string
	a    *pb.Attr
}

// NewFileInfo returns an fs.FileInfo named name for the attributes a.
// Its Sys method returns a.
func NewFileInfo(name string, a *pb.Attr) fs.FileInfo { return fileInfo{name: name, a: a} }

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return int64(fi.a.GetSize()) }
func (fi fileInfo) Mode() fs.FileMode  { return FileMode(fi.a.GetMode()) }
func (fi fileInfo) ModTime() time.Time { return time.Unix(0, fi.a.GetMtimeNs()) }
func (fi fileInfo) IsDir() bool        { return fi.a.GetMode()&sIFMT == sIFDIR }
func (fi fileInfo) Sys() any           { return fi.a }

// dirEntry is an fs.DirEntry from a directory listing. Info asks the
// cluster for the entry's attributes (without following a symlink).
type dirEntry struct {
	c      *Client
	parent uint64
	d      *pb.Dirent
}

func (e dirEntry) Name() string      { return e.d.GetName() }
func (e dirEntry) IsDir() bool       { return e.d.GetMode()&sIFMT == sIFDIR }
func (e dirEntry) Type() fs.FileMode { return FileMode(e.d.GetMode() & sIFMT).Type() }
func (e dirEntry) String() string    { return fs.FormatDirEntry(e) }

func (e dirEntry) Info() (fs.FileInfo, error) {
	a, err := e.c.stat(e.c.ctx, "lstat", &pb.Loc{Parent: e.parent, Name: e.d.GetName(), Nofollow: true})
	if err != nil {
		return nil, err
	}
	return fileInfo{name: e.d.GetName(), a: a}, nil
}

// listDir lists directory ino as fs.DirEntry values sorted by name.
func (c *Client) listDir(ctx context.Context, loc *pb.Loc) ([]fs.DirEntry, error) {
	// One query resolves loc and lists it: resolving first and listing the
	// inode in a second query let a rename in between (a directory renamed
	// over loc) make the listing fail with ENOENT for a path that always
	// existed. Entries name their parent by inode so that Info still finds
	// them if the directory is renamed meanwhile.
	ds, ino, err := c.readDir(ctx, loc, false)
	if err != nil {
		return nil, err
	}
	if ino == 0 {
		// A node too old to name the directory it listed.
		if ino = loc.GetIno(); ino == 0 {
			a, err := c.stat(ctx, "readdir", loc)
			if err != nil {
				return nil, err
			}
			ino = a.GetIno()
		}
	}
	out := make([]fs.DirEntry, len(ds))
	for i, d := range ds {
		out[i] = dirEntry{c: c, parent: ino, d: d}
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

// dirReader serves ReadDir(n) over one listing, taken at the first call.
type dirReader struct {
	ents   []fs.DirEntry
	loaded bool
}

func (d *dirReader) readDir(n int, load func() ([]fs.DirEntry, error)) ([]fs.DirEntry, error) {
	if !d.loaded {
		ents, err := load()
		if err != nil {
			return nil, err
		}
		d.ents, d.loaded = ents, true
	}
	if n <= 0 {
		out := d.ents
		d.ents = nil
		return out, nil
	}
	if len(d.ents) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.ents))
	out := d.ents[:n:n]
	d.ents = d.ents[n:]
	return out, nil
}

// clean turns a name into the absolute, clean path the protocol wants;
// a relative name is taken from the root.
func clean(name string) string {
	if !strings.HasPrefix(name, "/") {
		name = "/" + name
	}
	return path.Clean(name)
}
