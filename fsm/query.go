package fsm

import (
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// nominalFree is the free space statfs reports when there is no memory
// limit: the state machine does not look at the host's memory.
const nominalFree = 1 << 40

// query answers q from s, which is a published (immutable) state.
func (s *state) query(q *pb.Query) *pb.Result {
	if q.GetRoot() != "" && s.conf == nil {
		return s.confinedQuery(q)
	}
	r, err := s.answer(q)
	if err != nil {
		return errResult(err)
	}
	return r
}

func (s *state) answer(q *pb.Query) (*pb.Result, error) {
	switch x := q.GetQ().(type) {
	case *pb.Query_Stat:
		n, err := s.lookup(orEmpty(x.Stat).Loc)
		if err != nil {
			return nil, err
		}
		return &pb.Result{Attr: n.attr()}, nil
	case *pb.Query_Read:
		return s.read(orEmpty(x.Read))
	case *pb.Query_ReadDir:
		return s.readDir(orEmpty(x.ReadDir))
	case *pb.Query_Readlink:
		return s.readlink(orEmpty(x.Readlink))
	case *pb.Query_GetXattr:
		return s.getXattr(orEmpty(x.GetXattr))
	case *pb.Query_ListXattr:
		n, err := s.lookup(orEmpty(x.ListXattr).Loc)
		if err != nil {
			return nil, err
		}
		names := make([]string, 0, len(n.xattrs()))
		for _, a := range n.xattrs() {
			names = append(names, a.name)
		}
		return &pb.Result{Names: names}, nil
	case *pb.Query_Statfs:
		return &pb.Result{Statfs: s.statfs()}, nil
	case *pb.Query_Handle:
		return s.handleStatus(orEmpty(x.Handle))
	case *pb.Query_Usage:
		return s.usage(orEmpty(x.Usage))
	case *pb.Query_Lock:
		return s.lockQuery(orEmpty(x.Lock))
	case *pb.Query_Tokens:
		return s.listTokens(), nil
	case *pb.Query_Region:
		return s.regionQuery(orEmpty(x.Region))
	case *pb.Query_Seek:
		return s.seek(orEmpty(x.Seek))
	}
	return nil, errf(syscall.EINVAL, "query without a known question")
}

// seek answers lseek(2)'s SEEK_DATA and SEEK_HOLE from the file's chunks:
// a chunk with a block is data up to the chunk's end (or the end of file),
// one without is a hole, and the end of file counts as a hole.
func (s *state) seek(x *pb.SeekQuery) (*pb.Result, error) {
	n, err := s.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	switch {
	case n.isDir():
		return nil, errf(syscall.EISDIR, "seek in inode %d", n.ino)
	case !n.isReg():
		return nil, errf(syscall.EINVAL, "seek in non-regular inode %d", n.ino)
	case x.Offset < 0 || uint64(x.Offset) >= n.size:
		return nil, errf(syscall.ENXIO, "seek from %d in inode %d of %d bytes", x.Offset, n.ino, n.size)
	}
	off, cs := uint64(x.Offset), s.chunkSize
	if x.Hole {
		next := off / cs
		s.chunkRange(n.ino, next, func(idx uint64, _ *block.Block) bool {
			if idx != next {
				return false
			}
			next++
			return true
		})
		return &pb.Result{N: min(max(off, next*cs), n.size), Attr: n.attr()}, nil
	}
	found, at := false, uint64(0)
	s.chunkRange(n.ino, off/cs, func(idx uint64, _ *block.Block) bool {
		found, at = true, max(off, idx*cs)
		return false
	})
	if !found || at >= n.size {
		return nil, errf(syscall.ENXIO, "no data from %d in inode %d", off, n.ino)
	}
	return &pb.Result{N: at, Attr: n.attr()}, nil
}

func (s *state) read(x *pb.ReadQuery) (*pb.Result, error) {
	if x.Offset < 0 || x.Length < 0 {
		return nil, errf(syscall.EINVAL, "read of %d bytes at %d", x.Length, x.Offset)
	}
	var n *inode
	if x.Handle != 0 {
		h := s.handle(x.Handle)
		if h == nil {
			return nil, errf(syscall.EBADF, "handle %d", x.Handle)
		}
		if err := s.checkHandle(h); err != nil {
			return nil, err
		}
		if !h.granted {
			return nil, errf(syscall.EAGAIN, "handle %d is waiting for its exclusive open", x.Handle)
		}
		if !h.canRead() {
			return nil, errf(syscall.EBADF, "handle %d is not open for reading", x.Handle)
		}
		if n = s.inode(h.ino); n == nil {
			return nil, errf(syscall.EIO, "handle %d names missing inode %d", x.Handle, h.ino)
		}
	} else {
		var err error
		if n, err = s.lookup(orEmpty(x.Loc)); err != nil {
			return nil, err
		}
	}
	switch {
	case n.isDir():
		return nil, errf(syscall.EISDIR, "read inode %d", n.ino)
	case !n.isReg():
		return nil, errf(syscall.EINVAL, "read non-regular inode %d", n.ino)
	}
	data, eof := s.readData(n, uint64(x.Offset), uint64(x.Length))
	return &pb.Result{Data: data, Eof: eof, Attr: n.attr()}, nil
}

func (s *state) readDir(x *pb.ReadDirQuery) (*pb.Result, error) {
	n, err := s.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	if !n.isDir() {
		return nil, errf(syscall.ENOTDIR, "readdir inode %d", n.ino)
	}
	limit := int(x.Limit)
	if limit == 0 {
		limit = readDirLimit
	}
	limit = min(limit, maxReadDir)
	if x.Plus {
		limit = min(limit, readDirLimit)
	}
	it := s.dirents.root().Iterator()
	it.SeekLowerBound(dirKey(n.ino, x.Cookie))
	// Attr names the directory listed: a client that lists a path learns
	// which inode it listed from the same query, so a rename between two
	// queries cannot make it list another directory or none.
	r := &pb.Result{Eof: true, Attr: n.attr()}
	for {
		k, d, ok := it.Next()
		if !ok || len(k) < 8 || be.Uint64(k) != n.ino {
			break
		}
		name := string(k[8:])
		if name == x.Cookie {
			continue // the cookie is the last name already returned
		}
		if len(r.Entries) == limit {
			r.Eof = false
			break
		}
		e := &pb.Dirent{Name: name, Ino: d.ino, Mode: d.typ}
		if x.Plus {
			if c := s.inode(d.ino); c != nil {
				e.Attr = c.attr()
			}
		}
		r.Entries = append(r.Entries, e)
	}
	r.Cookie = x.Cookie
	if len(r.Entries) > 0 {
		r.Cookie = r.Entries[len(r.Entries)-1].Name
	}
	return r, nil
}

func (s *state) readlink(x *pb.ReadlinkQuery) (*pb.Result, error) {
	r, err := s.resolve(x.Loc, false) // readlink never follows the link it reads
	if err != nil {
		return nil, err
	}
	n, err := r.existing(x.Loc)
	if err != nil {
		return nil, err
	}
	if !n.isLnk() {
		return nil, errf(syscall.EINVAL, "readlink of non-symlink %s", locString(x.Loc))
	}
	return &pb.Result{Target: n.target()}, nil
}

func (s *state) getXattr(x *pb.GetXattrQuery) (*pb.Result, error) {
	if err := checkXattrName(x.Name); err != nil {
		return nil, err
	}
	n, err := s.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	xs := n.xattrs()
	i, found := findXattr(xs, x.Name)
	if !found {
		return nil, errf(syscall.ENODATA, "xattr %q", x.Name)
	}
	return &pb.Result{Data: xs[i].value}, nil
}

func (s *state) statfs() *pb.Statfs {
	st := s.blocks.Stats()
	total, free := st.PhysicalBytes+nominalFree, uint64(nominalFree)
	if st.Limit > 0 {
		total, free = st.Limit, st.Limit-min(st.Limit, st.PhysicalBytes)
	}
	return &pb.Statfs{
		TotalBytes: total, FreeBytes: free, Files: s.ninodes,
		BlockSize: uint32(s.chunkSize), MaxNameLen: maxNameLen,
		LogicalBytes: s.logical, PhysicalBytes: st.PhysicalBytes, BlockCount: st.Blocks,
	}
}

// handleStatus tells whether a queued exclusive open has been granted.
func (s *state) handleStatus(x *pb.HandleQuery) (*pb.Result, error) {
	h := s.handle(x.Handle)
	if h == nil || (x.Session != 0 && h.session != x.Session) {
		return nil, errf(syscall.EBADF, "handle %d", x.Handle)
	}
	if err := s.checkHandle(h); err != nil {
		return nil, err
	}
	if !h.granted {
		return &pb.Result{Handle: h.id, Queued: true}, nil
	}
	r := &pb.Result{Handle: h.id}
	if n := s.inode(h.ino); n != nil {
		r.Attr = n.attr()
	}
	return r, nil
}

// usage totals a file or directory tree: its files, their logical bytes,
// the bytes of the unique blocks they hold, and how many of those bytes
// are shared (held more than once, or also outside the tree).
func (s *state) usage(x *pb.UsageQuery) (*pb.Result, error) {
	top, err := s.lookup(orEmpty(x.Loc))
	if err != nil {
		return nil, err
	}
	u := &pb.TreeUsage{}
	seen := map[uint64]bool{}
	refs := map[*block.Block]int64{}
	var order []*block.Block
	stack := []*inode{top}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n.ino] {
			continue
		}
		seen[n.ino] = true
		switch {
		case n.isReg():
			u.Files++
			u.LogicalBytes += n.size
			s.chunkRange(n.ino, 0, func(_ uint64, b *block.Block) bool {
				if refs[b] == 0 {
					order = append(order, b)
				}
				refs[b]++
				return true
			})
		case n.isDir():
			for _, e := range s.entries(n.ino) {
				if c := s.inode(e.ino); c != nil {
					stack = append(stack, c)
				}
			}
		}
	}
	for _, b := range order {
		u.PhysicalBytes += uint64(b.Len())
		if refs[b] > 1 || s.blocks.Refs(b) > refs[b] {
			u.SharedBytes += uint64(b.Len())
		}
	}
	return &pb.Result{Usage: u}, nil
}
