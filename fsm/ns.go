package fsm

import (
	"strings"
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// mut returns a private copy of the current version of n, already in the
// transaction's tree, for the caller to change. Published inodes are never
// modified in place; a copy made earlier in the same entry is reused.
func (t *tx) mut(n *inode) *inode {
	t.touch(n.ino)
	return t.mutQuiet(n)
}

// mutQuiet is mut for bookkeeping that clients cannot see (open counts),
// which must not wake watchers.
func (t *tx) mutQuiet(n *inode) *inode {
	if m := t.fresh[n.ino]; m != nil {
		return m
	}
	cur := t.inode(n.ino)
	if cur == nil {
		cur = n
	}
	m := new(inode)
	*m = *cur
	t.own(m)
	return m
}

// own puts inode m, private to this transaction, into the tree and
// remembers it so that later changes in the entry need no copy.
func (t *tx) own(m *inode) {
	t.inodes.put(u64key(m.ino), m)
	if t.fresh == nil {
		t.fresh = make(map[uint64]*inode)
	}
	t.fresh[m.ino] = m
}

// newInode adds an inode with the next number, born at this log index,
// or with ino, a number reserved by the command's session (checked by
// checkReserved), born at its reservation's index.
func (t *tx) newInode(mode, uid, gid uint32, ino uint64) *inode {
	n := &inode{
		ino: t.nextIno, gen: t.index, mode: mode, nlink: 1, uid: uid, gid: gid,
		atime: t.stamp, mtime: t.stamp, ctime: t.stamp,
	}
	if gen, ok := t.takeReserved(ino); ok {
		n.ino, n.gen = ino, gen
	} else {
		t.nextIno++
	}
	if n.isDir() {
		n.nlink = 2
	}
	t.ninodes++
	t.own(n)
	t.touch(n.ino)
	return n
}

// addEntry links n into dir as name.
func (t *tx) addEntry(dir *inode, name string, n *inode) {
	t.dirents.put(dirKey(dir.ino, name), dent{ino: n.ino, typ: n.mode & modeType})
	if !n.isDir() {
		p := t.inode(n.ino).parent
		t.fileParent(n.ino, t.nameAdded(n.ino, p, dir.ino))
	}
	d := t.mut(dir)
	d.mtime, d.ctime = t.stamp, t.stamp
	if n.isDir() {
		d.nlink++
		if n.parent != d.ino {
			c := t.mut(n)
			c.parent = d.ino
		}
	}
	t.entryChanged(dir.ino, name)
}

// removeEntry unlinks name (naming n) from dir; n's link count is the
// caller's business (dropLink).
func (t *tx) removeEntry(dir *inode, name string, n *inode) {
	t.dirents.del(dirKey(dir.ino, name))
	if !n.isDir() {
		p := t.inode(n.ino).parent
		t.fileParent(n.ino, t.nameRemoved(n.ino, p, dir.ino))
	}
	d := t.mut(dir)
	d.mtime, d.ctime = t.stamp, t.stamp
	if n.isDir() && d.nlink > 2 {
		d.nlink--
	}
	t.entryChanged(dir.ino, name)
}

// dropLink counts one name less for n; with no name and no open handle
// it is freed.
func (t *tx) dropLink(n *inode) {
	n = t.mut(n)
	n.ctime = t.stamp
	if n.isDir() || n.nlink == 0 {
		n.nlink = 0
	} else {
		n.nlink--
	}
	if n.nlink == 0 {
		// Nobody may hold on to an inode without a name: the holder's
		// own capability goes too.
		t.dropCaps(0, n.ino)
		if n.opens == 0 {
			t.freeInode(n)
		}
	}
}

// freeInode removes n and releases its blocks.
func (t *tx) freeInode(n *inode) {
	var blocks []*block.Block
	t.chunkRange(n.ino, 0, func(_ uint64, b *block.Block) bool {
		blocks = append(blocks, b)
		return true
	})
	if len(blocks) > 0 {
		t.chunks.delPrefix(u64key(n.ino))
		for _, b := range blocks {
			t.releaseBlock(b)
		}
	}
	if n.isReg() {
		t.logical -= n.size
	}
	t.inodes.del(u64key(n.ino))
	delete(t.fresh, n.ino)
	t.locks.del(u64key(n.ino))
	t.rlocks.del(u64key(n.ino))
	t.ninodes--
	t.touch(n.ino)
	t.dropCaps(0, n.ino)
}

// newChild is newInode for an inode made in dir: in a set-group-ID
// directory it takes the directory's group, and a new directory there
// the bit too (the BSD rule that Linux applies to such directories).
// Stripping the bit from a new file of a creator outside the group is
// the kernel's part, before the request reaches a mount.
func (t *tx) newChild(dir *inode, mode, uid, gid uint32, ino uint64) *inode {
	if dir.mode&syscall.S_ISGID != 0 {
		gid = dir.gid
		if mode&modeType == modeDir {
			mode |= syscall.S_ISGID
		}
	}
	return t.newInode(mode, uid, gid, ino)
}

func (t *tx) mkdir(x *pb.MkdirCmd, sess *session) (*pb.Result, error) {
	r, err := t.newEntry(x.Loc, false)
	if err != nil {
		return nil, err
	}
	if err := checkReserved(sess, x.Ino); err != nil {
		return nil, err
	}
	if err := t.guard(r.dir.ino); err != nil {
		return nil, err
	}
	n := t.newChild(r.dir, modeDir|x.Mode&modePerm, x.Uid, x.Gid, x.Ino)
	n.parent = r.dir.ino
	t.addEntry(r.dir, r.name, n)
	return &pb.Result{Attr: t.inode(n.ino).attr(), Epoch: t.capCreated(r.dir, n)}, nil
}

// mknod makes a special file, or a regular one when mode has no type or
// S_IFREG, as mknod(2) does.
func (t *tx) mknod(x *pb.MknodCmd, sess *session) (*pb.Result, error) {
	mode := x.Mode
	switch {
	case mode&modeType == 0 || mode&modeType == modeReg:
		mode = modeReg | mode&modePerm
	case !specialType(mode):
		return nil, errf(syscall.EINVAL, "mknod of type %#o", mode&modeType)
	case x.Rdev > 0xffffffff:
		return nil, errf(syscall.EINVAL, "device number %#x", x.Rdev)
	}
	r, err := t.newEntry(x.Loc, false)
	if err != nil {
		return nil, err
	}
	if err := checkReserved(sess, x.Ino); err != nil {
		return nil, err
	}
	if err := t.guard(r.dir.ino); err != nil {
		return nil, err
	}
	n := t.newChild(r.dir, mode&(modeType|modePerm), x.Uid, x.Gid, x.Ino)
	if n.isDev() {
		n.size = x.Rdev
	}
	t.addEntry(r.dir, r.name, n)
	return &pb.Result{Attr: t.inode(n.ino).attr(), Epoch: t.capCreated(r.dir, n)}, nil
}

func (t *tx) symlink(x *pb.SymlinkCmd, sess *session) (*pb.Result, error) {
	switch {
	case x.Target == "":
		return nil, errf(syscall.ENOENT, "symlink with an empty target")
	case len(x.Target) > maxPathLen:
		return nil, errf(syscall.ENAMETOOLONG, "symlink target of %d bytes", len(x.Target))
	case strings.IndexByte(x.Target, 0) >= 0:
		return nil, errf(syscall.EINVAL, "symlink target contains NUL")
	}
	r, err := t.newEntry(x.Loc, false)
	if err != nil {
		return nil, err
	}
	if err := checkReserved(sess, x.Ino); err != nil {
		return nil, err
	}
	if err := t.guard(r.dir.ino); err != nil {
		return nil, err
	}
	n := t.newChild(r.dir, modeLnk|0o777, x.Uid, x.Gid, x.Ino)
	n.size = uint64(len(x.Target))
	n.ext = &inodeExt{target: strings.Clone(x.Target)}
	t.addEntry(r.dir, r.name, n)
	return &pb.Result{Attr: t.inode(n.ino).attr(), Epoch: t.capCreated(r.dir, n)}, nil
}

func (t *tx) link(x *pb.LinkCmd) (*pb.Result, error) {
	src, err := t.lookup(orEmpty(x.Src))
	if err != nil {
		return nil, err
	}
	r, err := t.newEntry(x.Dst, false)
	if err != nil {
		return nil, err
	}
	switch {
	case src.isDir():
		return nil, errf(syscall.EPERM, "hard link to directory %s", locString(x.Src))
	case src.nlink == 0:
		return nil, errf(syscall.ENOENT, "%s was removed", locString(x.Src))
	case src.nlink >= maxLinks:
		return nil, errf(syscall.EMLINK, "%s has %d links", locString(x.Src), src.nlink)
	}
	if err := t.guard(src.ino, r.dir.ino); err != nil {
		return nil, err
	}
	n := t.mut(src)
	n.nlink++
	n.ctime = t.stamp
	t.addEntry(r.dir, r.name, n)
	return &pb.Result{Attr: t.inode(n.ino).attr()}, nil
}

func (t *tx) remove(x *pb.RemoveCmd) (*pb.Result, error) {
	if x.DirOnly && x.FileOnly {
		return nil, errf(syscall.EINVAL, "remove with both dir_only and file_only")
	}
	r, err := t.oldEntry(x.Loc)
	if err != nil {
		return nil, err
	}
	n := r.node
	if n.isDir() {
		if x.FileOnly {
			return nil, errf(syscall.EISDIR, "unlink %s", locString(x.Loc))
		}
		if !t.dirEmpty(n.ino) {
			return nil, errf(syscall.ENOTEMPTY, "rmdir %s", locString(x.Loc))
		}
	} else if x.DirOnly {
		return nil, errf(syscall.ENOTDIR, "rmdir %s", locString(x.Loc))
	}
	if err := t.guard(r.dir.ino, n.ino); err != nil {
		return nil, err
	}
	t.removeEntry(r.dir, r.name, n)
	t.dropLink(n)
	return &pb.Result{}, nil
}

func (t *tx) rename(x *pb.RenameCmd) (*pb.Result, error) {
	sr, err := t.oldEntry(x.Src)
	if err != nil {
		return nil, err
	}
	dr, err := t.resolve(x.Dst, false)
	if err != nil {
		return nil, err
	}
	if dr.dir == nil && dr.node != nil && dr.node.ino == t.rootOf() && x.Dst.GetIno() == 0 {
		return nil, errf(syscall.EBUSY, "rename onto the root")
	}
	if err := dr.nameable(x.Dst); err != nil {
		return nil, err
	}
	if dr.dir.nlink == 0 {
		return nil, errf(syscall.ENOENT, "%s: directory was removed", locString(x.Dst))
	}
	s, d := sr.node, dr.node
	if d != nil && d.ino == s.ino {
		return &pb.Result{Attr: s.attr()}, nil // POSIX: same file, nothing to do
	}
	if err := t.renameCheck(s, d, sr, dr, x); err != nil {
		return nil, err
	}
	moved := []uint64{sr.dir.ino, dr.dir.ino, s.ino}
	if d != nil {
		moved = append(moved, d.ino)
	}
	if err := t.guard(moved...); err != nil {
		return nil, err
	}
	if d != nil {
		t.removeEntry(dr.dir, dr.name, d)
		t.dropLink(d)
	}
	t.removeEntry(sr.dir, sr.name, s)
	t.addEntry(dr.dir, dr.name, s)
	m := t.mut(s)
	m.ctime = t.stamp
	return &pb.Result{Attr: m.attr()}, nil
}

// renameCheck applies POSIX's rules for moving s onto d (nil: absent).
func (t *tx) renameCheck(s, d *inode, sr, dr resolved, x *pb.RenameCmd) error {
	if x.Noreplace && d != nil {
		return errf(syscall.EEXIST, "%s", locString(x.Dst))
	}
	if s.isDir() && t.within(dr.dir, s.ino) {
		return errf(syscall.EINVAL, "move %s into itself", locString(x.Src))
	}
	if d == nil {
		return nil
	}
	switch {
	case d.isDir() && t.within(sr.dir, d.ino):
		// Linux: the target is an ancestor of the source, so not empty.
		return errf(syscall.ENOTEMPTY, "%s contains %s", locString(x.Dst), locString(x.Src))
	case s.isDir() && !d.isDir():
		return errf(syscall.ENOTDIR, "%s is not a directory", locString(x.Dst))
	case !s.isDir() && d.isDir():
		return errf(syscall.EISDIR, "%s is a directory", locString(x.Dst))
	case d.isDir() && !t.dirEmpty(d.ino):
		return errf(syscall.ENOTEMPTY, "%s", locString(x.Dst))
	}
	return nil
}

// within reports whether directory dir is ino or lies below it.
func (s *state) within(dir *inode, ino uint64) bool {
	for depth := 0; dir != nil && depth < 1<<20; depth++ {
		if dir.ino == ino {
			return true
		}
		if dir.ino == rootIno {
			return false
		}
		dir = s.inode(dir.parent)
	}
	return false
}

// clone copies src to dst sharing its blocks: a file, a symlink, or with
// recursive a directory tree (hard links inside the tree stay linked).
// It adds no physical bytes, only references.
func (t *tx) clone(x *pb.CloneCmd) (*pb.Result, error) {
	src, err := t.lookup(orEmpty(x.Src))
	if err != nil {
		return nil, err
	}
	r, err := t.newEntry(x.Dst, false)
	if err != nil {
		return nil, err
	}
	if src.isDir() {
		if !x.Recursive {
			return nil, errf(syscall.EISDIR, "clone of directory %s needs recursive", locString(x.Src))
		}
		if t.within(r.dir, src.ino) {
			return nil, errf(syscall.EINVAL, "clone %s into itself", locString(x.Src))
		}
		// The copy reads the whole tree, not just what resolution read.
		if t.nexcl > 0 {
			if err := t.awaitBuffered(t.below(src)); err != nil {
				return nil, err
			}
		}
	}
	if err := t.guard(r.dir.ino); err != nil {
		return nil, err
	}
	c := cloner{t: t, seen: map[uint64]uint64{}}
	ino := c.copy(src, r.dir, r.name)
	return &pb.Result{Attr: t.inode(ino).attr()}, nil
}

type cloner struct {
	t    *tx
	seen map[uint64]uint64 // source inode -> its copy, for hard links
}

// copy clones n as name in dir and returns the copy's inode number.
func (c *cloner) copy(n *inode, dir *inode, name string) uint64 {
	t := c.t
	if ino, ok := c.seen[n.ino]; ok && !n.isDir() {
		m := t.mut(t.inode(ino))
		m.nlink++
		t.addEntry(dir, name, m)
		return ino
	}
	m := t.newInode(n.mode, n.uid, n.gid, 0)
	c.seen[n.ino] = m.ino
	m.size, m.stored, m.ext = n.size, n.stored, n.ext
	m.atime, m.mtime = n.atime, n.mtime
	if n.isReg() {
		t.logical += n.size
		// Collect first: the tree must not change under its iterator.
		var idxs []uint64
		var blocks []*block.Block
		t.chunkRange(n.ino, 0, func(idx uint64, b *block.Block) bool {
			idxs, blocks = append(idxs, idx), append(blocks, b)
			return true
		})
		for i, b := range blocks {
			t.refBlock(b)
			t.chunks.put(pairKey(m.ino, idxs[i]), b)
		}
	}
	t.addEntry(dir, name, m)
	if n.isDir() {
		for _, e := range t.entries(n.ino) {
			if child := t.inode(e.ino); child != nil {
				c.copy(child, t.inode(m.ino), e.name)
			}
		}
	}
	return m.ino
}

// below lists the inodes under directory n.
func (s *state) below(n *inode) []uint64 {
	var out []uint64
	dirs := []uint64{n.ino}
	for len(dirs) > 0 {
		d := dirs[len(dirs)-1]
		dirs = dirs[:len(dirs)-1]
		for _, e := range s.entries(d) {
			out = append(out, e.ino)
			if c := s.inode(e.ino); c != nil && c.isDir() {
				dirs = append(dirs, e.ino)
			}
		}
	}
	return out
}

type namedEntry struct {
	name string
	ino  uint64
}

// entries lists directory ino in name order.
func (s *state) entries(ino uint64) []namedEntry {
	var out []namedEntry
	it := s.dirents.root().Iterator()
	it.SeekPrefix(u64key(ino))
	for {
		k, d, ok := it.Next()
		if !ok {
			return out
		}
		out = append(out, namedEntry{name: string(k[8:]), ino: d.ino})
	}
}
