package fsm

import (
	"slices"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
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
	if err := t.awaitBuffered(x.Inos); err != nil {
		return nil, err
	}
	return &pb.Result{}, nil
}

// awaitBuffered refuses the running command for a recall while a session
// other than its own holds an exclusive capability on any of inos (which
// the command read, or is about to), recalling those capabilities.
func (t *tx) awaitBuffered(inos []uint64) error {
	if in := t.bufferedBy(inos, t.cmdSession); len(in) > 0 {
		t.recall(in)
		return errRecall
	}
	return nil
}

// bufferedBy returns the exclusive capabilities on inos that sessions
// other than session hold, in inode order: what the state may be behind
// on. Queries (BufferedBy) and commands (awaitBuffered) share it.
func (s *state) bufferedBy(inos []uint64, session uint64) []*capab {
	if s.nexcl == 0 || len(inos) == 0 {
		return nil
	}
	var in []*capab
	for _, ino := range slices.Compact(slices.Sorted(slices.Values(inos))) {
		for _, c := range s.capsOf(ino) {
			if c.excl && c.session != session {
				in = append(in, c)
			}
		}
	}
	return in
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
	if q.GetRoot() != "" {
		v, root, err := s.confined(q)
		if err != nil {
			return nil
		}
		defer SwapInodes(q, root)
		s = v
	}
	var out []uint64
	for _, c := range s.bufferedBy(s.readsOf(q), session) {
		out = append(out, c.ino)
	}
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
	case *pb.Query_Seek:
		return s.locReads(x.Seek.GetLoc(), true)
	}
	return nil
}

// locReads lists what resolving loc reads. follow is whether the query
// follows a final symlink (unless loc says nofollow).
func (s *state) locReads(loc *pb.Loc, follow bool) []uint64 {
	_, reads, _ := s.resolveReads(loc, follow && !loc.GetNofollow())
	return reads
}

// resolveReads is resolve that also lists what the resolution read: the
// directories looked in and symlinks followed on the way, and the inode
// it leads to.
func (s *state) resolveReads(loc *pb.Loc, follow bool) (resolved, []uint64, error) {
	var reads []uint64
	r, err := s.resolveWith(&walker{s: s, seen: &reads}, loc, follow)
	if err == nil && r.node != nil {
		reads = append(reads, r.node.ino)
	}
	return r, reads, err
}

// Commands and exclusive capabilities. A command of another session must
// not decide anything from what such a holder may be ahead on: a name it
// removed or created in a directory it holds, a file it wrote. So every
// resolution in a command goes through tx.resolve, which waits (a recall,
// like a conflicting change) while a session other than the command's
// holds an exclusive capability on anything the resolution read, whatever
// the answer would have been (ENOENT and EEXIST included). The holder
// sends what it buffered before it releases, and the command is applied
// again on top of that. A holder's own commands, batches included, never
// wait for its own capabilities.

// resolve is state.resolve for the running command. Handlers resolve
// through it (and lookup, newEntry, oldEntry), never through t.state.
func (t *tx) resolve(loc *pb.Loc, follow bool) (resolved, error) {
	if t.nexcl == 0 {
		return t.state.resolve(loc, follow)
	}
	r, reads, err := t.resolveReads(loc, follow)
	if err := t.awaitBuffered(reads); err != nil {
		return resolved{}, err
	}
	return r, err
}

// lookup is state.lookup for the running command (see resolve).
func (t *tx) lookup(loc *pb.Loc) (*inode, error) {
	r, err := t.resolve(loc, !loc.GetNofollow())
	if err != nil {
		return nil, err
	}
	return r.existing(loc)
}
