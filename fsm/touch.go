package fsm

import (
	"slices"
	"syscall"

	pb "github.com/memoryfs/memfs/proto"
)

// Reads and exclusive capabilities. A session holding an exclusive
// capability answers changes to the inode itself and commits them later
// (BatchCmd), so the cluster's state of that inode may be behind what the
// holder has acknowledged. Before a node answers a linearizable read of
// another session that covers such an inode it applies a TouchCmd naming
// it, which waits, as a change would, until the capability is released or
// revoked; the holder sends what it buffered before it releases, so the
// read then sees it.

// touchCmd changes nothing. It is refused for a recall while a session
// other than the command's holds an exclusive capability on any of
// x.Inos; shared capabilities do not matter, their holders buffer nothing.
func (t *tx) touchCmd(x *pb.TouchCmd) (*pb.Result, error) {
	if len(x.Inos) > maxGrant {
		return nil, errf(syscall.E2BIG, "touch of %d inodes (at most %d)", len(x.Inos), maxGrant)
	}
	if t.nexcl == 0 {
		return &pb.Result{}, nil
	}
	inos := slices.Compact(slices.Sorted(slices.Values(x.Inos)))
	var in []*capab
	for _, ino := range inos {
		for _, c := range t.capsOf(ino) {
			if c.excl && c.session != t.cmdSession {
				in = append(in, c)
			}
		}
	}
	if len(in) > 0 {
		t.recall(in)
		return nil, errRecall
	}
	return &pb.Result{}, nil
}

// BufferedBy returns the inodes that query q reads and that a session
// other than session holds an exclusive capability on, in ascending
// order: those whose holder may have acknowledged changes the cluster has
// not seen yet. A read covers the inode its location leads to and, for a
// path or a parent and name, every directory looked in and symlink
// followed on the way; a readdir with attributes also the entries it
// lists. Statfs and handle queries read none. It costs one comparison
// while no exclusive capability exists.
func (f *FSM) BufferedBy(q *pb.Query, session uint64) []uint64 {
	s := f.cur.Load()
	if s.nexcl == 0 {
		return nil
	}
	var out []uint64
	for _, ino := range s.readsOf(q) {
		for _, c := range s.capsOf(ino) {
			if c.excl && c.session != session {
				out = append(out, ino)
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// readsOf lists the inodes answering q reads (with repeats).
func (s *state) readsOf(q *pb.Query) []uint64 {
	switch x := q.GetQ().(type) {
	case *pb.Query_Stat:
		return s.locReads(x.Stat.GetLoc(), true)
	case *pb.Query_Read:
		if h := s.handle(x.Read.GetHandle()); h != nil {
			return []uint64{h.ino}
		}
		return s.locReads(x.Read.GetLoc(), true)
	case *pb.Query_ReadDir:
		out := s.locReads(x.ReadDir.GetLoc(), true)
		if x.ReadDir.GetPlus() {
			if r, err := s.readDir(x.ReadDir); err == nil {
				for _, e := range r.Entries {
					out = append(out, e.Ino)
				}
			}
		}
		return out
	case *pb.Query_Readlink:
		return s.locReads(x.Readlink.GetLoc(), false)
	case *pb.Query_GetXattr:
		return s.locReads(x.GetXattr.GetLoc(), true)
	case *pb.Query_ListXattr:
		return s.locReads(x.ListXattr.GetLoc(), true)
	case *pb.Query_Usage:
		return s.locReads(x.Usage.GetLoc(), true)
	}
	return nil
}

// locReads lists what resolving loc reads: the directories and symlinks
// on the way and the inode it leads to. follow is whether the query
// follows a final symlink (unless loc says nofollow).
func (s *state) locReads(loc *pb.Loc, follow bool) []uint64 {
	var seen []uint64
	r, err := s.resolveWith(&walker{s: s, seen: &seen}, loc, follow && !loc.GetNofollow())
	if err == nil && r.node != nil {
		seen = append(seen, r.node.ino)
	}
	return seen
}
