package fsm

import (
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/proto"
)

// chunkOp is the planned new content of one chunk.
type chunkOp struct {
	idx  uint64
	old  *block.Block // the block it replaces; nil for a hole
	data []byte       // new content; nil (and ref nil) makes the chunk a hole
	hash block.Hash
	own  bool         // data is a private buffer the store may keep
	ref  *block.Block // the new content is this stored block (write by hash)
}

// plan is a data change computed in full (content built and hashed)
// before anything is modified, so that it can be refused with ENOSPC.
type plan struct {
	ino uint64
	ops []chunkOp
}

// planWrite builds the chunks that writing data at off produces. A chunk
// the write covers entirely takes data's bytes directly (copied once, by
// the store, if new); a partly covered chunk is copied from the old block
// and patched.
func (t *tx) planWrite(n *inode, off uint64, data []byte) plan {
	cs := t.chunkSize
	end := off + uint64(len(data))
	p := plan{ino: n.ino, ops: make([]chunkOp, 0, (end-1)/cs-off/cs+1)}
	for idx := off / cs; idx*cs < end; idx++ {
		cstart := idx * cs
		lo := max(off, cstart) - cstart
		hi := min(end, cstart+cs) - cstart
		piece := data[cstart+lo-off : cstart+hi-off]
		op := chunkOp{idx: idx, old: t.chunk(n.ino, idx)}
		oldLen := uint64(op.old.Len())
		if lo == 0 && hi >= oldLen {
			op.data = piece
		} else {
			buf := make([]byte, max(oldLen, hi))
			if op.old != nil {
				copy(buf, op.old.Data())
			}
			copy(buf[lo:], piece)
			op.data, op.own = buf, true
		}
		op.seal()
		p.ops = append(p.ops, op)
	}
	return p
}

// seal hashes the new content, or makes an all-zero chunk a hole.
func (op *chunkOp) seal() {
	if block.IsZero(op.data) {
		op.data = nil
		return
	}
	op.hash = block.Sum(op.data)
}

// planTruncate builds the chunk changes of shrinking n to size: the chunks
// past the end go, and a chunk cut in the middle gets a shorter block.
func (t *tx) planTruncate(n *inode, size uint64) plan {
	p := plan{ino: n.ino}
	if size >= n.size {
		return p
	}
	cs := t.chunkSize
	keep := (size + cs - 1) / cs
	if cut := size % cs; cut != 0 {
		if old := t.chunk(n.ino, size/cs); old != nil && uint64(old.Len()) > cut {
			op := chunkOp{idx: size / cs, old: old, data: make([]byte, cut), own: true}
			copy(op.data, old.Data())
			op.seal()
			p.ops = append(p.ops, op)
		}
	}
	t.chunkRange(n.ino, keep, func(idx uint64, b *block.Block) bool {
		p.ops = append(p.ops, chunkOp{idx: idx, old: b})
		return true
	})
	return p
}

// fits refuses a plan whose new physical bytes, less the bytes it frees,
// would exceed the memory budget.
func (t *tx) fits(p *plan) error {
	if t.blocks.Limit() == 0 {
		return nil
	}
	var add, free uint64
	newHashes := make(map[block.Hash]bool, len(p.ops))
	for _, op := range p.ops {
		if op.data == nil {
			continue
		}
		if !newHashes[op.hash] && !t.blocks.Has(op.hash) {
			add += uint64(len(op.data))
		}
		newHashes[op.hash] = true
	}
	released := make(map[*block.Block]int64, len(p.ops))
	for _, op := range p.ops {
		if op.old != nil {
			released[op.old]++
		}
	}
	for b, n := range released {
		if t.blocks.Refs(b) <= n && !newHashes[b.Hash()] {
			free += uint64(b.Len())
		}
	}
	if !t.blocks.FitsChange(add, free) {
		st := t.blocks.Stats()
		return errf(syscall.ENOSPC, "%d new bytes over the budget (%d of %d used)", add-min(add, free), st.PhysicalBytes, st.Limit)
	}
	return nil
}

// apply carries a plan out and returns the change of the inode's stored
// bytes. New blocks are stored before old ones are released, so content
// that stays the same is never dropped and re-stored.
func (t *tx) apply(p *plan) int64 {
	var delta int64
	for i := range p.ops {
		op := &p.ops[i]
		key := pairKey(p.ino, op.idx)
		var b *block.Block
		switch {
		case op.ref != nil:
			t.blocks.RefBlock(op.ref)
			b = op.ref
		case op.data != nil && op.own:
			b = t.blocks.Adopt(op.hash, op.data)
		case op.data != nil:
			b = t.blocks.PutHashed(op.hash, op.data)
		}
		if b != nil {
			t.chunks.put(key, b)
		} else if op.old != nil {
			t.chunks.del(key)
		}
		delta += int64(b.Len()) - int64(op.old.Len())
	}
	for _, op := range p.ops {
		if op.old != nil {
			t.blocks.Release(op.old)
		}
	}
	return delta
}

func (t *tx) write(x *pb.WriteCmd, sess *session) (*pb.Result, error) {
	if x.Handle == 0 && (x.Create || x.Truncate) {
		return t.writeFile(x)
	}
	var n *inode
	appending := x.Append
	if x.Handle != 0 {
		h, hn, err := t.handleFor(x.Handle, sess)
		if err != nil {
			return nil, err
		}
		if !h.canWrite() {
			return nil, errf(syscall.EBADF, "handle %d is not open for writing", x.Handle)
		}
		n, appending = hn, appending || h.flags&oAppend != 0
	} else {
		var err error
		if n, err = t.lookup(orEmpty(x.Loc)); err != nil {
			return nil, err
		}
	}
	switch {
	case n.isDir():
		return nil, errf(syscall.EISDIR, "write to inode %d", n.ino)
	case !n.isReg():
		return nil, errf(syscall.EINVAL, "write to symlink inode %d", n.ino)
	case x.Offset < 0:
		return nil, errf(syscall.EINVAL, "write at offset %d", x.Offset)
	}
	off := uint64(x.Offset)
	if appending {
		off = n.size
	}
	p, length, err := t.planData(n, off, x)
	if err != nil {
		return nil, err
	}
	if length == 0 {
		return &pb.Result{Attr: n.attr()}, nil
	}
	if err := t.fits(&p); err != nil {
		return nil, err
	}
	return t.commitWrite(n, &p, off, length), nil
}

// planData plans writing x's data (or blocks named by hash) at off into n.
func (t *tx) planData(n *inode, off uint64, x *pb.WriteCmd) (plan, uint64, error) {
	if len(x.Hashes) > 0 {
		return t.planRefs(n, off, x)
	}
	length := uint64(len(x.Data))
	if err := checkExtent(off, length); err != nil || length == 0 {
		return plan{ino: n.ino}, length, err
	}
	return t.planWrite(n, off, x.Data), length, nil
}

// commitWrite carries out a validated write plan on n.
func (t *tx) commitWrite(n *inode, p *plan, off, length uint64) *pb.Result {
	stored := t.apply(p)
	m := t.mut(n)
	m.stored = uint64(int64(m.stored) + stored)
	if end := off + length; end > m.size {
		t.logical += end - m.size
		m.size = end
	}
	m.mtime, m.ctime = t.now, t.now
	return &pb.Result{N: length, Attr: m.attr()}
}

// writeFile is os.WriteFile as one command: open the regular file at loc,
// creating it when missing (create) and emptying it (truncate), then write.
// Everything is checked, the budget included, before anything changes.
func (t *tx) writeFile(x *pb.WriteCmd) (*pb.Result, error) {
	loc := orEmpty(x.Loc)
	if x.Append || x.Offset < 0 {
		return nil, errf(syscall.EINVAL, "create/truncate write with append or offset %d", x.Offset)
	}
	r, err := t.resolve(loc, !loc.Nofollow && !x.Excl)
	if err != nil {
		return nil, err
	}
	n := r.node
	switch {
	case n == nil && !x.Create:
		_, err = r.existing(loc)
	case n == nil && r.slash:
		err = errf(syscall.EISDIR, "create %s", locString(loc))
	case n == nil:
		err = r.creatable(loc)
	case x.Create && x.Excl:
		err = errf(syscall.EEXIST, "%s", locString(loc))
	case n.isDir():
		err = errf(syscall.EISDIR, "write to %s", locString(loc))
	case !n.isReg():
		err = errf(syscall.EINVAL, "write to non-regular %s", locString(loc))
	}
	if err != nil {
		return nil, err
	}
	// Plan against an empty file when the data lands in a new or emptied
	// one; ino 0 names no inode, so no old chunk is found.
	target := n
	if n == nil || x.Truncate {
		target = &inode{}
	}
	off := uint64(x.Offset)
	p, length, err := t.planData(target, off, x)
	if err != nil {
		return nil, err
	}
	var trunc plan
	if n != nil && x.Truncate {
		trunc = t.planTruncate(n, 0)
	}
	both := plan{ops: append(append([]chunkOp(nil), trunc.ops...), p.ops...)}
	if err := t.fits(&both); err != nil {
		return nil, err
	}
	// Validated: from here on nothing fails.
	switch {
	case n == nil:
		n = t.newInode(modeReg|x.Mode&modePerm, x.Uid, x.Gid)
		t.addEntry(r.dir, r.name, n)
	case x.Truncate:
		n = t.truncateToZero(n)
	}
	p.ino = n.ino
	return t.commitWrite(n, &p, off, length), nil
}

func checkExtent(off, length uint64) error {
	if length > maxWriteLen {
		return errf(syscall.EFBIG, "write of %d bytes", length)
	}
	if off+length > maxFileSize {
		return errf(syscall.EFBIG, "write to %d past the maximum file size", off+length)
	}
	return nil
}

// planRefs plans a write whose blocks are named by hash (dedup on the
// wire): each must be stored, full-size except a last one ending at or
// past the end of file.
func (t *tx) planRefs(n *inode, off uint64, x *pb.WriteCmd) (plan, uint64, error) {
	cs := t.chunkSize
	length := x.Length
	switch {
	case len(x.Data) > 0:
		return plan{}, 0, errf(syscall.EINVAL, "write with both data and hashes")
	case off%cs != 0:
		return plan{}, 0, errf(syscall.EINVAL, "write by hash at unaligned offset %d", off)
	case length == 0 || (length+cs-1)/cs != uint64(len(x.Hashes)):
		return plan{}, 0, errf(syscall.EINVAL, "%d hashes for %d bytes", len(x.Hashes), length)
	}
	if err := checkExtent(off, length); err != nil {
		return plan{}, 0, err
	}
	p := plan{ino: n.ino, ops: make([]chunkOp, len(x.Hashes))}
	for i, hb := range x.Hashes {
		h, err := block.ParseHash(hb)
		if err != nil {
			return plan{}, 0, errf(syscall.EINVAL, "hash %d: %v", i, err)
		}
		b := t.blocks.Get(h)
		if b == nil {
			return plan{}, 0, errf(syscall.EREMOTEIO, "block %s is not stored", h.Short())
		}
		want := min(cs, length-uint64(i)*cs)
		if uint64(b.Len()) != want {
			return plan{}, 0, errf(syscall.EINVAL, "block %s has %d bytes, want %d", h.Short(), b.Len(), want)
		}
		idx := off/cs + uint64(i)
		p.ops[i] = chunkOp{idx: idx, old: t.chunk(n.ino, idx), ref: b}
	}
	if length%cs != 0 && off+length < n.size {
		return plan{}, 0, errf(syscall.EINVAL, "short last block before the end of file")
	}
	return p, length, nil
}

// truncateToZero empties regular file n (O_TRUNC); it frees and never
// needs space.
func (t *tx) truncateToZero(n *inode) *inode {
	p := t.planTruncate(n, 0)
	t.apply(&p)
	m := t.mut(n)
	t.logical -= m.size
	m.size, m.stored = 0, 0
	m.mtime, m.ctime = t.now, t.now
	return m
}

// zeroChunk backs reads of holes within one chunk.
var zeroChunk [block.DefaultChunkSize]byte

func zeros(n uint64) []byte {
	if n <= uint64(len(zeroChunk)) {
		return zeroChunk[:n:n]
	}
	return make([]byte, n)
}

// readData returns length bytes of n from off (fewer at end of file) and
// whether the range reaches the end of file. A range within one stored
// chunk is a slice of the block, not a copy.
func (s *state) readData(n *inode, off, length uint64) ([]byte, bool) {
	length = min(length, maxReadLen)
	if off >= n.size {
		return nil, true
	}
	end := min(off+length, n.size)
	eof := end >= n.size
	if end == off {
		return nil, eof
	}
	cs := s.chunkSize
	first, last := off/cs, (end-1)/cs
	if first == last {
		lo, hi := off-first*cs, end-first*cs
		b := s.chunk(n.ino, first)
		if b == nil || uint64(b.Len()) <= lo {
			return zeros(hi - lo), eof
		}
		if d := b.Data(); hi <= uint64(len(d)) {
			return d[lo:hi:hi], eof
		}
	}
	buf := make([]byte, end-off)
	s.chunkRange(n.ino, first, func(idx uint64, b *block.Block) bool {
		if idx > last {
			return false
		}
		cstart := idx * cs
		d := b.Data()
		lo := max(off, cstart) - cstart
		if lo < uint64(len(d)) {
			copy(buf[cstart+lo-off:], d[lo:min(uint64(len(d)), end-cstart)])
		}
		return true
	})
	return buf, eof
}
