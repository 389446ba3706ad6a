package fsm

import (
	"bytes"
	"slices"
	"strings"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

const setAll = uint32(pb.SetAttrBit_SET_MODE | pb.SetAttrBit_SET_UID | pb.SetAttrBit_SET_GID |
	pb.SetAttrBit_SET_SIZE | pb.SetAttrBit_SET_ATIME | pb.SetAttrBit_SET_MTIME |
	pb.SetAttrBit_SET_ATIME_NOW | pb.SetAttrBit_SET_MTIME_NOW)

func has(valid uint32, bit pb.SetAttrBit) bool { return valid&uint32(bit) != 0 }

// setAttr is chmod, chown, truncate and utimens in one command; the size
// change is planned (and refused with ENOSPC) before any attribute moves.
func (t *tx) setAttr(x *pb.SetAttrCmd, sess *session) (*pb.Result, error) {
	access := x.Valid == uint32(pb.SetAttrBit_SET_ATIME_READ)
	if x.Valid&^setAll != 0 && !access {
		return nil, errf(syscall.EINVAL, "set_attr bits %#x", x.Valid)
	}
	var n *inode
	if x.Handle != 0 {
		h, hn, err := t.handleFor(x.Handle, sess)
		if err != nil {
			return nil, err
		}
		if has(x.Valid, pb.SetAttrBit_SET_SIZE) && !h.canWrite() {
			return nil, errf(syscall.EINVAL, "truncate through read-only handle %d", x.Handle)
		}
		n = hn
	} else {
		var err error
		if n, err = t.lookup(orEmpty(x.Loc)); err != nil {
			return nil, err
		}
	}
	var p plan
	if has(x.Valid, pb.SetAttrBit_SET_SIZE) {
		switch {
		case x.Size < 0:
			return nil, errf(syscall.EINVAL, "truncate to %d", x.Size)
		case x.Size > maxFileSize:
			return nil, errf(syscall.EFBIG, "truncate to %d", x.Size)
		case n.isDir():
			return nil, errf(syscall.EISDIR, "truncate inode %d", n.ino)
		case !n.isReg():
			return nil, errf(syscall.EINVAL, "truncate non-regular inode %d", n.ino)
		}
		p = t.planTruncate(n, uint64(x.Size))
		if err := t.fits(&p); err != nil {
			return nil, err
		}
	}
	if x.Valid == 0 || access && !t.atimeStale(n) {
		return &pb.Result{Attr: n.attr()}, nil
	}
	if err := t.guard(n.ino); err != nil {
		return nil, err
	}
	m := t.mut(n)
	if access {
		m.atime = t.stamp // an access is no change of attributes: ctime stays
		return &pb.Result{Attr: m.attr()}, nil
	}
	t.setTimesAndOwner(m, x)
	if has(x.Valid, pb.SetAttrBit_SET_SIZE) {
		m.stored = uint64(int64(m.stored) + t.carryOut(&p))
		size := uint64(x.Size)
		t.logical = t.logical - m.size + size
		m.size = size
		m.mtime = t.stamp
	}
	m.ctime = t.stamp
	return &pb.Result{Attr: m.attr()}, nil
}

// atimeStale is the relatime rule: an access moves n's atime when it is
// not later than the last change of data or attributes, or a day old.
func (t *tx) atimeStale(n *inode) bool {
	const day = int64(24 * 60 * 60 * 1e9)
	return n.atime <= n.mtime || n.atime <= n.ctime || t.stamp-n.atime >= day
}

func (t *tx) setTimesAndOwner(m *inode, x *pb.SetAttrCmd) {
	v := x.Valid
	if has(v, pb.SetAttrBit_SET_MODE) {
		m.mode = m.mode&modeType | x.Mode&modePerm
	}
	if has(v, pb.SetAttrBit_SET_UID) {
		m.uid = x.Uid
	}
	if has(v, pb.SetAttrBit_SET_GID) {
		m.gid = x.Gid
	}
	switch {
	case has(v, pb.SetAttrBit_SET_ATIME_NOW):
		m.atime = t.stamp
	case has(v, pb.SetAttrBit_SET_ATIME):
		m.atime = x.AtimeNs
	}
	switch {
	case has(v, pb.SetAttrBit_SET_MTIME_NOW):
		m.mtime = t.stamp
	case has(v, pb.SetAttrBit_SET_MTIME):
		m.mtime = x.MtimeNs
	}
}

// Extended attribute flags (Linux values).
const (
	xattrCreate  = 1
	xattrReplace = 2
)

func checkXattrName(name string) error {
	if name == "" || len(name) > maxXattrName {
		return errf(syscall.ERANGE, "xattr name of %d bytes", len(name))
	}
	if strings.IndexByte(name, 0) >= 0 {
		return errf(syscall.EINVAL, "xattr name contains NUL")
	}
	return nil
}

// findXattr returns the position of name in sorted xs and whether it is
// there.
func findXattr(xs []xattr, name string) (int, bool) {
	return slices.BinarySearchFunc(xs, name, func(x xattr, n string) int { return strings.Compare(x.name, n) })
}

func (t *tx) setXattr(x *pb.SetXattrCmd) (*pb.Result, error) {
	if err := checkXattrName(x.Name); err != nil {
		return nil, err
	}
	switch {
	case len(x.Value) > maxXattrValue:
		return nil, errf(syscall.E2BIG, "xattr value of %d bytes", len(x.Value))
	case x.Flags&^(xattrCreate|xattrReplace) != 0 || x.Flags == xattrCreate|xattrReplace:
		return nil, errf(syscall.EINVAL, "xattr flags %#x", x.Flags)
	}
	n, err := t.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	old := n.xattrs()
	i, found := findXattr(old, x.Name)
	switch {
	case found && x.Flags == xattrCreate:
		return nil, errf(syscall.EEXIST, "xattr %q", x.Name)
	case !found && x.Flags == xattrReplace:
		return nil, errf(syscall.ENODATA, "xattr %q", x.Name)
	}
	total := len(x.Name) + len(x.Value)
	for j, a := range old {
		if !(found && j == i) {
			total += len(a.name) + len(a.value)
		}
	}
	if total > maxXattrTotal {
		return nil, errf(syscall.ENOSPC, "xattrs of inode %d would take %d bytes", n.ino, total)
	}
	if err := t.guard(n.ino); err != nil {
		return nil, err
	}
	a := xattr{name: strings.Clone(x.Name), value: bytes.Clone(x.Value)}
	if a.value == nil {
		a.value = []byte{}
	}
	xs := slices.Clone(old)
	if found {
		xs[i] = a
	} else {
		xs = slices.Insert(xs, i, a)
	}
	t.setXattrs(n, xs)
	return &pb.Result{}, nil
}

func (t *tx) removeXattr(x *pb.RemoveXattrCmd) (*pb.Result, error) {
	if err := checkXattrName(x.Name); err != nil {
		return nil, err
	}
	n, err := t.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	i, found := findXattr(n.xattrs(), x.Name)
	if !found {
		return nil, errf(syscall.ENODATA, "xattr %q", x.Name)
	}
	if err := t.guard(n.ino); err != nil {
		return nil, err
	}
	t.setXattrs(n, slices.Delete(slices.Clone(n.xattrs()), i, i+1))
	return &pb.Result{}, nil
}

func (t *tx) setXattrs(n *inode, xs []xattr) {
	m := t.mut(n)
	if len(xs) == 0 && m.target() == "" {
		m.ext = nil
	} else {
		m.ext = &inodeExt{target: m.target(), xattrs: xs}
	}
	m.ctime = t.stamp
}
