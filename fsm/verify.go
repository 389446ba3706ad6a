package fsm

import (
	"cmp"
	"slices"

	"github.com/memoryfs/memfs/fsm/block"
)

// verify checks a restored state's invariants and fills in what the
// snapshot does not carry (open counts, stored bytes, logical bytes,
// minLease). Later commands rely on these invariants, so a snapshot that
// breaks one is refused rather than trusted.
func verify(s *state) error {
	links, err := verifyInodes(s)
	if err != nil {
		return err
	}
	if err := verifyDirents(s, links); err != nil {
		return err
	}
	if err := verifyChunks(s); err != nil {
		return err
	}
	if err := verifyHandles(s); err != nil {
		return err
	}
	if err := verifyLinks(s, links); err != nil {
		return err
	}
	if err := verifyReachable(s); err != nil {
		return err
	}
	if err := verifySessions(s); err != nil {
		return err
	}
	if err := verifyCaps(s); err != nil {
		return err
	}
	if err := verifyRanges(s); err != nil {
		return err
	}
	if err := verifyFileLocks(s); err != nil {
		return err
	}
	s.commit()
	return nil
}

// linkCount is what the directory entries say about one inode.
type linkCount struct {
	names   uint32 // entries naming it
	subdirs uint32 // directories it holds
}

func verifyInodes(s *state) (map[uint64]*linkCount, error) {
	links := make(map[uint64]*linkCount, s.inodes.len())
	var err error
	s.inodes.root().Walk(func(_ []byte, n *inode) bool {
		err = checkInode(s, n)
		links[n.ino] = &linkCount{}
		return err != nil
	})
	if err != nil {
		return nil, err
	}
	if uint64(len(links)) != s.ninodes {
		return nil, badSnap("%d inodes, header says %d", len(links), s.ninodes)
	}
	if root := s.inode(rootIno); root == nil || !root.isDir() {
		return nil, badSnap("no root directory")
	}
	return links, nil
}

func checkInode(s *state, n *inode) error {
	switch {
	case n.ino == 0 || n.ino >= s.nextIno:
		return badSnap("inode number %d (next %d)", n.ino, s.nextIno)
	case !n.isDir() && !n.isReg() && !n.isLnk() && !n.isSpecial():
		return badSnap("inode %d: mode %#o", n.ino, n.mode)
	case n.size > maxFileSize && !n.isDev():
		return badSnap("inode %d: size %d", n.ino, n.size)
	case n.isSpecial() && (n.stored != 0 || !n.isDev() && n.size != 0 || n.size > 0xffffffff):
		return badSnap("inode %d: size %d", n.ino, n.size)
	case n.isLnk() && (n.target() == "" || len(n.target()) > maxPathLen || uint64(len(n.target())) != n.size):
		return badSnap("symlink %d: target of %d bytes, size %d", n.ino, len(n.target()), n.size)
	case !n.isLnk() && n.target() != "":
		return badSnap("inode %d: target on a non-symlink", n.ino)
	}
	total := 0
	for i, a := range n.xattrs() {
		if checkXattrName(a.name) != nil || len(a.value) > maxXattrValue {
			return badSnap("inode %d: bad xattr %q", n.ino, a.name)
		}
		if i > 0 && n.xattrs()[i-1].name >= a.name {
			return badSnap("inode %d: xattrs out of order", n.ino)
		}
		total += len(a.name) + len(a.value)
	}
	if total > maxXattrTotal {
		return badSnap("inode %d: %d bytes of xattrs", n.ino, total)
	}
	if n.isReg() {
		s.logical += n.size
	}
	return nil
}

func verifyDirents(s *state, links map[uint64]*linkCount) error {
	var err error
	s.dirents.root().Walk(func(k []byte, d dent) bool {
		parent, name := be.Uint64(k), string(k[8:])
		p, c := s.inode(parent), s.inode(d.ino)
		switch {
		case len(k) <= 8 || checkName(name) != nil || name == "." || name == "..":
			err = badSnap("entry %q in %d: bad name", name, parent)
		case p == nil || !p.isDir():
			err = badSnap("entry %q: parent %d is not a directory", name, parent)
		case c == nil || c.ino == rootIno:
			err = badSnap("entry %q in %d names inode %d", name, parent, d.ino)
		case d.typ != c.mode&modeType:
			err = badSnap("entry %q in %d: type %#o, inode has %#o", name, parent, d.typ, c.mode&modeType)
		case c.isDir() && c.parent != parent:
			err = badSnap("directory %d in %d says its parent is %d", c.ino, parent, c.parent)
		}
		if err != nil {
			return true
		}
		links[d.ino].names++
		if c.isDir() {
			links[parent].subdirs++
		} else if p := s.nameAdded(d.ino, c.parent, parent); p != c.parent {
			m := *c
			m.parent = p
			s.inodes.put(u64key(m.ino), &m)
		}
		return false
	})
	return err
}

func verifyChunks(s *state) error {
	var err error
	stored := make(map[uint64]uint64)
	s.chunks.root().Walk(func(k []byte, b *block.Block) bool {
		ino, idx := be.Uint64(k), be.Uint64(k[8:])
		n := s.inode(ino)
		switch {
		case n == nil || !n.isReg():
			err = badSnap("chunk %d of inode %d, not a regular file", idx, ino)
		case idx >= maxFileSize/s.chunkSize || idx*s.chunkSize+uint64(b.Len()) > n.size:
			err = badSnap("chunk %d of inode %d lies past its size %d", idx, ino, n.size)
		}
		stored[ino] += uint64(b.Len())
		return err != nil
	})
	for ino, bytes := range stored {
		n := *s.inode(ino)
		n.stored = bytes
		s.inodes.put(u64key(ino), &n)
	}
	return err
}

func verifyHandles(s *state) error {
	var err error
	opens := make(map[uint64]uint32)
	perSession := make(map[uint64]uint32)
	s.handles.root().Walk(func(_ []byte, h *handle) bool {
		switch {
		case h.id == 0 || h.id >= s.nextHandle:
			err = badSnap("handle %d (next %d)", h.id, s.nextHandle)
		case s.inode(h.ino) == nil:
			err = badSnap("handle %d names missing inode %d", h.id, h.ino)
		case s.session(h.session) == nil:
			err = badSnap("handle %d of missing session %d", h.id, h.session)
		case h.flags&oAccMode == oAccMode:
			err = badSnap("handle %d: flags %#x", h.id, h.flags)
		case h.excl && !lockHas(s.lock(h.ino), h):
			err = badSnap("exclusive handle %d is not in its inode's lock", h.id)
		case !h.excl && !h.granted:
			err = badSnap("handle %d queued but not exclusive", h.id)
		}
		opens[h.ino]++
		perSession[h.session]++
		return err != nil
	})
	if err != nil {
		return err
	}
	for ino, c := range opens {
		n := *s.inode(ino)
		n.opens = c
		s.inodes.put(u64key(ino), &n)
	}
	for id, c := range perSession {
		x := *s.session(id)
		x.handles = c
		s.sessions.put(u64key(id), &x)
	}
	s.locks.root().Walk(func(k []byte, l *xlock) bool {
		ino := be.Uint64(k)
		ids := append([]uint64{l.holder}, l.queue...)
		slices.Sort(ids)
		if len(slices.Compact(ids)) != 1+len(l.queue) {
			err = badSnap("lock on %d lists a handle twice", ino)
		}
		for _, id := range append([]uint64{l.holder}, l.queue...) {
			if h := s.handle(id); h == nil || h.ino != ino || !h.excl {
				err = badSnap("lock on %d names handle %d", ino, id)
			}
		}
		return err != nil
	})
	return err
}

// lockHas reports whether l holds (granted) or queues (not granted) h.
func lockHas(l *xlock, h *handle) bool {
	if l == nil {
		return false
	}
	if h.granted {
		return l.holder == h.id
	}
	return slices.Contains(l.queue, h.id)
}

// verifyLinks checks link counts: names for files, 2 + subdirectories for
// directories; an inode without a name must be held open.
func verifyLinks(s *state, links map[uint64]*linkCount) error {
	var err error
	s.inodes.root().Walk(func(_ []byte, n *inode) bool {
		lc := links[n.ino]
		switch {
		case lc.names == 0 && n.ino != rootIno:
			if n.nlink != 0 || n.opens == 0 {
				err = badSnap("inode %d has no name, nlink %d, %d handles", n.ino, n.nlink, n.opens)
			}
		case n.isDir():
			if lc.names > 1 || n.nlink != 2+lc.subdirs {
				err = badSnap("directory %d: %d names, nlink %d, %d subdirectories", n.ino, lc.names, n.nlink, lc.subdirs)
			}
		case n.nlink != lc.names:
			err = badSnap("inode %d: nlink %d, %d names", n.ino, n.nlink, lc.names)
		}
		return err != nil
	})
	return err
}

// verifyReachable checks that every named directory hangs off the root, so
// walks up and down the tree (rename checks, clone) always end.
func verifyReachable(s *state) error {
	named := 0
	s.dirents.root().Walk(func(_ []byte, d dent) bool {
		if d.typ == modeDir {
			named++
		}
		return false
	})
	seen := 0
	stack := []uint64{rootIno}
	for len(stack) > 0 && seen <= named {
		ino := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, e := range s.entries(ino) {
			if c := s.inode(e.ino); c != nil && c.isDir() {
				seen++
				stack = append(stack, e.ino)
			}
		}
	}
	if seen != named {
		return badSnap("%d named directories, %d reachable from the root", named, seen)
	}
	return nil
}

// verifyCaps checks that every capability names a live session and a
// linked inode, and counts them.
func verifyCaps(s *state) error {
	var err error
	var prev *capab // the previous capability in key order: inode, then session
	s.caps.root().Walk(func(_ []byte, c *capab) bool {
		n := s.inode(c.ino)
		conflict := prev != nil && prev.ino == c.ino && (prev.excl || c.excl)
		prev = c
		switch {
		case conflict:
			err = badSnap("capability of session %d on %d is exclusive, but another session holds one", c.session, c.ino)
		case s.session(c.session) == nil:
			err = badSnap("capability on %d of unknown session %d", c.ino, c.session)
		case n == nil || n.nlink == 0:
			err = badSnap("capability of session %d on missing inode %d", c.session, c.ino)
		case c.epoch == 0 || c.epoch > s.index || c.revokeAt < 0:
			err = badSnap("capability of session %d on %d: epoch %d at index %d", c.session, c.ino, c.epoch, s.index)
		case c.since == 0 || c.since > c.epoch:
			err = badSnap("capability of session %d on %d: tenure from %d, epoch %d", c.session, c.ino, c.since, c.epoch)
		case c.leecher != 0 && (c.leecher == c.session || s.session(c.leecher) == nil):
			err = badSnap("capability of session %d on %d: leecher %d is not another live session", c.session, c.ino, c.leecher)
		}
		s.ncaps++
		if c.excl {
			s.nexcl++
		}
		if c.revokeAt != 0 && (s.minRevoke == 0 || c.revokeAt < s.minRevoke) {
			s.minRevoke = c.revokeAt
		}
		return err != nil
	})
	return err
}

func verifySessions(s *state) error {
	var err error
	s.sessions.root().Walk(func(_ []byte, x *session) bool {
		switch {
		case x.id == 0 || x.id >= s.nextSession:
			err = badSnap("session %d (next %d)", x.id, s.nextSession)
		case x.leaseMs <= 0 || x.leaseMs > maxLeaseMs || x.expires <= 0 || len(x.client) > maxClientLen:
			err = badSnap("session %d: lease %d ms", x.id, x.leaseMs)
		}
		if s.minLease == 0 || x.expires < s.minLease {
			s.minLease = x.expires
		}
		return err != nil
	})
	return err
}

// verifyRanges checks the sessions' inode reservations: each is a
// non-empty run of at most maxReserve numbers below nextIno, none of them
// taken by an inode, made at an index already applied, and no two
// overlap, so every number a create may name is free and one only.
func verifyRanges(s *state) error {
	type owned struct {
		inoRange
		session uint64
	}
	var all []owned
	var err error
	s.sessions.root().Walk(func(_ []byte, x *session) bool {
		for _, r := range x.ranges {
			switch {
			case r.next <= rootIno || r.next >= r.end || r.end-r.next > maxReserve || r.end > s.nextIno:
				err = badSnap("session %d: reservation [%d, %d) (next inode %d)", x.id, r.next, r.end, s.nextIno)
			case r.epoch == 0 || r.epoch > s.index:
				err = badSnap("session %d: reservation [%d, %d) made at %d, index %d", x.id, r.next, r.end, r.epoch, s.index)
			}
			all = append(all, owned{r, x.id})
		}
		return err != nil
	})
	if err != nil {
		return err
	}
	slices.SortFunc(all, func(a, b owned) int { return cmp.Compare(a.next, b.next) })
	for i, r := range all {
		if i > 0 && r.next < all[i-1].end {
			return badSnap("reservations [%d, %d) of session %d and [%d, %d) of session %d overlap",
				all[i-1].next, all[i-1].end, all[i-1].session, r.next, r.end, r.session)
		}
		it := s.inodes.root().Iterator()
		it.SeekLowerBound(u64key(r.next))
		if k, _, ok := it.Next(); ok && be.Uint64(k) < r.end {
			return badSnap("inode %d lies in the unused reservation [%d, %d) of session %d", be.Uint64(k), r.next, r.end, r.session)
		}
	}
	return nil
}

// verifyFileLocks checks the file locks: each of a live session on a
// live inode, a range in order (a flock's the whole file), no two held
// ones in conflict nor two of one owner overlapping, and waiters numbered
// below the next handle, each once, and held up by some lock (a waiter
// nothing holds up would have been granted).
func verifyFileLocks(s *state) error {
	var err error
	waiters := make(map[uint64]bool)
	s.rlocks.root().Walk(func(k []byte, fl *fileLocks) bool {
		ino := be.Uint64(k)
		if len(fl.held)+len(fl.waiting) == 0 {
			err = badSnap("empty lock record for %d", ino)
			return true
		}
		if s.inode(ino) == nil {
			err = badSnap("locks on missing inode %d", ino)
			return true
		}
		for i, l := range append(slices.Clip(fl.held), fl.waiting...) {
			waiting := i >= len(fl.held)
			switch {
			case s.session(l.session) == nil:
				err = badSnap("lock on %d of unknown session %d", ino, l.session)
			case l.start > l.end || (l.bsd && (l.start != 0 || l.end != lockEOF)):
				err = badSnap("lock on %d: range %d-%d", ino, l.start, l.end)
			case waiting && (l.waiter == 0 || l.waiter >= s.nextHandle || waiters[l.waiter]):
				err = badSnap("lock waiter %d on %d", l.waiter, ino)
			case waiting && len(blockers(fl.held, &l)) == 0:
				err = badSnap("lock waiter %d on %d waits for nothing", l.waiter, ino)
			}
			if err != nil {
				return true
			}
			waiters[l.waiter] = waiting
			if waiting {
				continue
			}
			for j := range i {
				o := &fl.held[j]
				if o.conflicts(&l) || (o.sameOwner(&l) && o.overlaps(&l)) {
					err = badSnap("locks on %d: two held locks overlap", ino)
					return true
				}
			}
		}
		return false
	})
	return err
}
