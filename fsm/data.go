package fsm

import (
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
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
			op.old.ReadAt(buf, 0)
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
			old.ReadAt(op.data, 0)
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
		if op.ref != nil {
			newHashes[op.ref.Hash()] = true // kept: not freed even if released
			continue
		}
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
		if t.blockRefs(b) <= n && !newHashes[b.Hash()] {
			free += uint64(b.Len())
		}
	}
	// Releases a running batch put off free their bytes when it ends.
	free += t.pendingFree(newHashes)
	if !t.blocks.FitsChange(add, free) {
		st := t.blocks.Stats()
		return errf(syscall.ENOSPC, "%d new bytes over the budget (%d of %d used)", add-min(add, free), st.PhysicalBytes, st.Limit)
	}
	return nil
}

// carryOut carries a write plan out and returns the change of the inode's
// stored bytes. New blocks are stored before old ones are released, so content
// that stays the same is never dropped and re-stored.
func (t *tx) carryOut(p *plan) int64 {
	var delta int64
	for i := range p.ops {
		op := &p.ops[i]
		key := pairKey(p.ino, op.idx)
		var b *block.Block
		switch {
		case op.ref != nil:
			t.refBlock(op.ref)
			b = op.ref
		case op.data != nil && op.own:
			b = t.adoptBlock(op.hash, op.data)
		case op.data != nil:
			b = t.putBlock(op.hash, op.data)
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
			t.releaseBlock(op.old)
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
		return nil, errf(syscall.EINVAL, "write to non-regular inode %d", n.ino)
	case x.Offset < 0:
		return nil, errf(syscall.EINVAL, "write at offset %d", x.Offset)
	}
	off := uint64(x.Offset)
	if appending {
		off = n.size
	}
	if len(x.Hashes) > 0 && off != uint64(x.Offset) {
		// The pieces were cut for x.Offset; an append lands elsewhere.
		if namesBlocks(x.Hashes) {
			return nil, errf(syscall.EREMOTEIO, "write by hash for offset %d lands at %d (append): resend the data", x.Offset, off)
		}
		// Only sums, which fit chunks it no longer covers: the data alone
		// is the write (a handle opened O_APPEND, which the leader that
		// cut the pieces cannot see).
		if uint64(len(x.Data)) != x.Length {
			return nil, errf(syscall.EINVAL, "%d bytes of data for a write of %d", len(x.Data), x.Length)
		}
		x = &pb.WriteCmd{Data: x.Data}
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
	if err := t.guard(n.ino); err != nil {
		return nil, err
	}
	return t.commitWrite(n, &p, off, length), nil
}

// namesBlocks reports whether any piece of a write goes by hash.
func namesBlocks(hashes [][]byte) bool {
	for _, h := range hashes {
		if len(h) > 0 {
			return true
		}
	}
	return false
}

// planData plans writing x's data (or blocks named by hash) at off into n.
func (t *tx) planData(n *inode, off uint64, x *pb.WriteCmd) (plan, uint64, error) {
	if len(x.Hashes) > 0 {
		return t.planRefs(n, off, x)
	}
	if len(x.Sums) > 0 {
		return plan{}, 0, errf(syscall.EINVAL, "sums without pieces (hashes)")
	}
	length := uint64(len(x.Data))
	if err := checkExtent(off, length); err != nil || length == 0 {
		return plan{ino: n.ino}, length, err
	}
	return t.planWrite(n, off, x.Data), length, nil
}

// commitWrite carries out a validated write plan on n.
func (t *tx) commitWrite(n *inode, p *plan, off, length uint64) *pb.Result {
	stored := t.carryOut(p)
	m := t.mut(n)
	m.stored = uint64(int64(m.stored) + stored)
	if end := off + length; end > m.size {
		t.logical += end - m.size
		m.size = end
	}
	m.mtime, m.ctime = t.stamp, t.stamp
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
	if n == nil {
		err = t.guard(r.dir.ino)
	} else {
		err = t.guard(n.ino)
	}
	if err != nil {
		return nil, err
	}
	// Validated: from here on nothing fails.
	var epoch uint64
	switch {
	case n == nil:
		n = t.newChild(r.dir, modeReg|x.Mode&modePerm, x.Uid, x.Gid, 0)
		t.addEntry(r.dir, r.name, n)
		epoch = t.capCreated(r.dir, n)
	case x.Truncate:
		n = t.truncateToZero(n)
	}
	p.ino = n.ino
	res := t.commitWrite(n, &p, off, length)
	res.Epoch = epoch
	return res, nil
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

// planRefs plans a write that names blocks by hash (dedup on the wire).
// The write [off, off+length) is cut at chunk boundaries into pieces;
// hashes has one entry per piece. A non-empty entry names a stored block
// that becomes the piece's whole chunk: the piece must start at a chunk
// boundary and be a whole chunk, or a shorter last piece that ends at or
// past the end of file. An empty entry means the piece's bytes follow in
// data, pieces in order, so one command can mix stored and new chunks and
// have unaligned edges. A named block that is not stored is EREMOTEIO:
// the sender resends the data.
func (t *tx) planRefs(n *inode, off uint64, x *pb.WriteCmd) (plan, uint64, error) {
	cs := t.chunkSize
	length := x.Length
	if err := checkExtent(off, length); err != nil {
		return plan{}, 0, err
	}
	end := off + length
	if length == 0 || (end-1)/cs-off/cs+1 != uint64(len(x.Hashes)) {
		return plan{}, 0, errf(syscall.EINVAL, "%d hashes for %d bytes at %d", len(x.Hashes), length, off)
	}
	if len(x.Sums) > 0 && len(x.Sums) != len(x.Hashes) {
		return plan{}, 0, errf(syscall.EINVAL, "%d sums for %d pieces", len(x.Sums), len(x.Hashes))
	}
	p := plan{ino: n.ino, ops: make([]chunkOp, 0, len(x.Hashes))}
	data := x.Data
	for i, hb := range x.Hashes {
		idx := off/cs + uint64(i)
		lo, hi := max(off, idx*cs), min(end, (idx+1)*cs)
		var sum []byte
		if len(x.Sums) > 0 {
			sum = x.Sums[i]
		}
		if len(hb) == 0 {
			if uint64(len(data)) < hi-lo {
				return plan{}, 0, errf(syscall.EINVAL, "data ends before piece %d", i)
			}
			ops, err := t.planPiece(n, idx, lo, data[:hi-lo], sum)
			if err != nil {
				return plan{}, 0, err
			}
			p.ops = append(p.ops, ops...)
			data = data[hi-lo:]
			continue
		}
		if len(sum) > 0 {
			return plan{}, 0, errf(syscall.EINVAL, "piece %d is named by hash and has a sum", i)
		}
		op, err := t.refOp(n, idx, lo, hi, hb)
		if err != nil {
			return plan{}, 0, err
		}
		p.ops = append(p.ops, op)
	}
	if len(data) != 0 {
		return plan{}, 0, errf(syscall.EINVAL, "%d bytes of data beyond the pieces", len(data))
	}
	return p, length, nil
}

// planPiece plans the piece of a write at lo, inside chunk idx, whose
// bytes are carried in the command. With a sum (stamped by the leader,
// which hashed the piece already) the piece must be the whole chunk, and
// its block is stored under that sum instead of being hashed again.
func (t *tx) planPiece(n *inode, idx, lo uint64, piece, sum []byte) ([]chunkOp, error) {
	if len(sum) == 0 {
		return t.planWrite(n, lo, piece).ops, nil
	}
	h, err := block.ParseHash(sum)
	switch {
	case err != nil:
		return nil, errf(syscall.EINVAL, "chunk %d: sum: %v", idx, err)
	case lo != idx*t.chunkSize || uint64(len(piece)) != t.chunkSize:
		return nil, errf(syscall.EINVAL, "sum for chunk %d, which the piece does not cover whole", idx)
	}
	op := chunkOp{idx: idx, old: t.chunk(n.ino, idx), data: piece, hash: h}
	if block.IsZero(piece) {
		op.data, op.hash = nil, block.Hash{}
	}
	return []chunkOp{op}, nil
}

// refOp plans chunk idx of n to become the stored block named by hb, for
// the piece [lo, hi) of a write.
func (t *tx) refOp(n *inode, idx, lo, hi uint64, hb []byte) (chunkOp, error) {
	cs := t.chunkSize
	h, err := block.ParseHash(hb)
	switch {
	case err != nil:
		return chunkOp{}, errf(syscall.EINVAL, "chunk %d: %v", idx, err)
	case lo != idx*cs:
		return chunkOp{}, errf(syscall.EINVAL, "block by hash at unaligned offset %d", lo)
	case hi-lo < cs && hi < n.size:
		return chunkOp{}, errf(syscall.EINVAL, "short block by hash before the end of file")
	}
	b := t.blocks.Get(h)
	if b == nil {
		return chunkOp{}, errf(syscall.EREMOTEIO, "block %s is not stored", h.Short())
	}
	if uint64(b.Len()) != hi-lo {
		return chunkOp{}, errf(syscall.EINVAL, "block %s has %d bytes, want %d", h.Short(), b.Len(), hi-lo)
	}
	return chunkOp{idx: idx, old: t.chunk(n.ino, idx), ref: b}, nil
}

// truncateToZero empties regular file n (O_TRUNC); it frees and never
// needs space.
func (t *tx) truncateToZero(n *inode) *inode {
	p := t.planTruncate(n, 0)
	t.carryOut(&p)
	m := t.mut(n)
	t.logical -= m.size
	m.size, m.stored = 0, 0
	m.mtime, m.ctime = t.stamp, t.stamp
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
// whether the range reaches the end of file, always in a buffer of its
// own.
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
		if hi <= uint64(b.Len()) {
			// A copy: the block's memory is off the Go heap and goes back
			// to the kernel once the block is unreachable, which may be
			// before the caller is done with the result.
			buf := make([]byte, hi-lo)
			b.ReadAt(buf, int(lo))
			return buf, eof
		}
	}
	buf := make([]byte, end-off)
	s.chunkRange(n.ino, first, func(idx uint64, b *block.Block) bool {
		if idx > last {
			return false
		}
		cstart := idx * cs
		lo := max(off, cstart) - cstart
		b.ReadAt(buf[cstart+lo-off:end-off], int(lo))
		return true
	})
	return buf, eof
}
