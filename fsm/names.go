package fsm

// Where each file is named. A confined request may name a file by number
// only when a directory inside its confinement names it, so the state
// machine must get from a file to its directories. Nearly every file has
// one name: its directory is kept in the inode's parent field, which
// directories use for their own parent and files had no use for, so it
// costs no memory. A file named in more than one place (hard links)
// holds manyDirs there instead, and the links index counts its names by
// directory. Which form a file takes depends on its directory entries
// alone (a file whose names drop to one leaves the index again), so the
// index is the same whatever the order of the commands that made the
// entries, and a replica that rebuilds it from a snapshot's entries
// (verifyDirents) holds exactly what one that applied the log holds.
// Directories are not in the index: a directory has one name and its
// parent field always says where.

// manyDirs in a file's parent field: its directories are in links. No
// inode has this number (numbers stay below nextIno, a uint64).
const manyDirs = ^uint64(0)

// nameAdded records one more name of file ino, whose parent field is p,
// in directory dir, and returns the file's new parent field.
func (s *state) nameAdded(ino, p, dir uint64) uint64 {
	switch p {
	case 0:
		return dir // its only name
	case manyDirs:
	default:
		s.countLink(ino, p, 1) // its second name: both go to the index
	}
	s.countLink(ino, dir, 1)
	return manyDirs
}

// nameRemoved records one name less of file ino, whose parent field is p,
// in directory dir, and returns the file's new parent field: 0 when it
// has no name left, its directory when it has one.
func (s *state) nameRemoved(ino, p, dir uint64) uint64 {
	if p != manyDirs {
		return 0
	}
	s.countLink(ino, dir, -1)
	it := s.links.root().Iterator()
	it.SeekPrefix(u64key(ino))
	k, names, ok := it.Next()
	switch {
	case !ok:
		return 0
	case names > 1:
		return manyDirs
	}
	last := be.Uint64(k[8:])
	if _, _, more := it.Next(); more {
		return manyDirs
	}
	s.links.del(pairKey(ino, last)) // one name left: back in the inode
	return last
}

// countLink adds delta to the names of file ino in directory dir.
func (s *state) countLink(ino, dir uint64, delta int) {
	k := pairKey(ino, dir)
	c, _ := s.links.get(k)
	switch n := int(c) + delta; {
	case n > 0:
		s.links.put(k, uint32(n))
	default:
		s.links.del(k)
	}
}

// namedIn calls fn with each directory that names file n (none for a
// file without a name) until fn returns false.
func (s *state) namedIn(n *inode, fn func(dir uint64) bool) {
	switch n.parent {
	case 0:
	case manyDirs:
		it := s.links.root().Iterator()
		it.SeekPrefix(u64key(n.ino))
		for {
			k, _, ok := it.Next()
			if !ok || !fn(be.Uint64(k[8:])) {
				return
			}
		}
	default:
		fn(n.parent)
	}
}

// fileParent sets file ino's parent field to p: bookkeeping no client
// sees, so no watcher wakes for it.
func (t *tx) fileParent(ino, p uint64) {
	if n := t.inode(ino); n != nil && n.parent != p {
		t.mutQuiet(n).parent = p
	}
}
