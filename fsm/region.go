package fsm

import (
	"fmt"
	"slices"
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Regions and their handoff (docs/regions.md). A managed region keeps a
// file's data in its holder's memory under an exclusive capability. To
// move it to another host, the new host's session registers as the
// capability's leecher (LeechCmd) and pulls the committed chunks while
// the holder goes on writing; the holder then hands the capability over
// with a HandoffCmd, which in one entry ends its own tenure and starts
// the leecher's. The leecher is a field of the holder's capability, so
// it lives and dies with it and is kept by snapshots as the capability
// is ('C' record, flag capLeech).

// maxRegionHashes bounds the chunk hashes one RegionQuery returns
// (16,384 hashes of 32 bytes: about half the largest message).
const maxRegionHashes = 1 << 14

// exclHolder returns the exclusive capability on ino, or nil.
func (s *state) exclHolder(ino uint64) *capab {
	for _, c := range s.capsOf(ino) {
		if c.excl {
			return c
		}
	}
	return nil
}

// leech registers (or, with cancel, withdraws) the session as the
// leecher of another session's exclusive capability on x.Ino. It changes
// no inode, so it guards nothing and recalls nothing: the holder goes on
// writing.
func (t *tx) leech(x *pb.LeechCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "leech needs a session")
	}
	if err := t.checkNamed(x.Ino); err != nil {
		return nil, err
	}
	c := t.exclHolder(x.Ino)
	if c == nil || c.session == sess.id {
		return nil, errf(syscall.ENOENT, "no other session holds inode %d exclusively", x.Ino)
	}
	r := *c
	switch {
	case x.Cancel:
		if c.leecher != sess.id {
			return &pb.Result{}, nil
		}
		r.leecher, r.ready = 0, false
	case c.leecher != 0 && c.leecher != sess.id:
		return nil, errf(syscall.EBUSY, "session %d leeches inode %d already", c.leecher, x.Ino)
	default:
		r.leecher, r.ready = sess.id, x.Ready
	}
	t.putCap(&r)
	return &pb.Result{Epoch: c.epoch, Session: c.session}, nil
}

// handoff moves the session's exclusive capability on x.Ino to its
// leecher x.To. The fence rule of batches decides whether the session
// still holds it as it believes: a holder that lost it (revoked, or its
// session renewed) hands nothing over. A recall pending on it is
// dropped with it: the command that waited is applied again (capsGone)
// and recalls the leecher's in turn.
func (t *tx) handoff(x *pb.HandoffCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "handoff needs a session")
	}
	if err := t.checkNamed(x.Ino); err != nil {
		return nil, err
	}
	c, ok := t.caps.get(pairKey(x.Ino, sess.id))
	if !ok || !c.excl || c.since > x.Epoch || c.epoch < x.Epoch {
		return nil, errf(syscall.EKEYREVOKED, "session %d does not hold inode %d exclusively since epoch %d", sess.id, x.Ino, x.Epoch)
	}
	if x.To == 0 || c.leecher != x.To || t.session(x.To) == nil {
		return nil, errf(syscall.ENOENT, "session %d is not the leecher of inode %d", x.To, x.Ino)
	}
	if err := checkChanged(x); err != nil {
		return nil, err
	}
	if err := t.handoffWrites(x, sess.id); err != nil {
		return nil, err
	}
	t.delCap(c)
	nc := &capab{session: x.To, ino: x.Ino, epoch: t.index, since: t.index, excl: true, reported: x.Report}
	if x.Report {
		nc.changed = slices.Clone(x.Changed)
	}
	t.putCap(nc)
	return &pb.Result{Epoch: t.index, Session: x.To}, nil
}

// maxChanged bounds the chunks a handoff may report changed (a holder
// with more lets the leecher compare hashes).
const maxChanged = 1 << 16

// checkChanged refuses a handoff's list of changed chunks unless it is
// ascending without repeats and bounded.
func checkChanged(x *pb.HandoffCmd) error {
	switch {
	case !x.Report && len(x.Changed) > 0:
		return errf(syscall.EINVAL, "handoff lists changed chunks without report")
	case len(x.Changed) > maxChanged:
		return errf(syscall.E2BIG, "handoff lists %d changed chunks (at most %d)", len(x.Changed), maxChanged)
	}
	for i := 1; i < len(x.Changed); i++ {
		if x.Changed[i] <= x.Changed[i-1] {
			return errf(syscall.EINVAL, "handoff's changed chunks are not ascending at %d", i)
		}
	}
	return nil
}

// handoffWrites applies the holder's last writes of a handoff, all or
// none, so that its last push and the move of its capability are one
// entry.
func (t *tx) handoffWrites(x *pb.HandoffCmd, session uint64) error {
	if len(x.Writes) == 0 {
		return nil
	}
	if len(x.Writes) > maxBatch {
		return errf(syscall.E2BIG, "handoff with %d writes (at most %d)", len(x.Writes), maxBatch)
	}
	for i, w := range x.Writes {
		switch {
		case w.GetLoc().GetIno() != x.Ino || w.Loc.Parent != 0 || w.Loc.Name != "" || w.Loc.Path != "":
			return errf(syscall.EINVAL, "write %d of a handoff of inode %d names another file", i+1, x.Ino)
		case w.Handle != 0 || w.Append || w.Create || w.Truncate || len(w.Hashes) > 0 || len(w.Sums) > 0 || w.Length != 0:
			return errf(syscall.EINVAL, "write %d of a handoff carries more than an offset and data", i+1)
		}
	}
	sp := t.save()
	t.blog = &blockLog{}
	defer func() { t.blog = nil }()
	for i, w := range x.Writes {
		_, err := t.nested(&pb.Command{Op: &pb.Command_Write{Write: w}}, session)
		if err == errRecall {
			t.rollback(sp, true)
			return err
		}
		if err != nil {
			t.rollback(sp, false)
			return fmt.Errorf("write %d of the handoff: %w", i+1, err)
		}
	}
	t.blog.settle(t.blocks)
	return nil
}

// checkNamed refuses, for a confined client, an inode named by number
// outside its directory.
func (s *state) checkNamed(ino uint64) error {
	if n := s.inode(ino); n != nil {
		return s.checkInside(n)
	}
	return nil
}

// dropLeecher withdraws session id (ended) from every capability it
// leeches.
func (t *tx) dropLeecher(id uint64) {
	if t.nexcl == 0 {
		return
	}
	var in []*capab
	t.caps.root().Walk(func(_ []byte, c *capab) bool {
		if c.leecher == id {
			in = append(in, c)
		}
		return false
	})
	for _, c := range in {
		r := *c
		r.leecher, r.ready = 0, false
		t.putCap(&r)
	}
}

// regionQuery answers a RegionQuery. Queued (with wait) means nothing
// the asker named has changed yet.
func (s *state) regionQuery(x *pb.RegionQuery) (*pb.Result, error) {
	var n *inode
	if x.Ino == 0 && x.Loc != nil {
		var err error
		if n, err = s.lookup(x.Loc); err != nil {
			return nil, err
		}
	} else if n = s.inode(x.Ino); n == nil || n.nlink == 0 {
		return nil, errf(syscall.ENOENT, "inode %d", x.Ino)
	} else if err := s.checkInside(n); err != nil {
		return nil, err
	}
	if !n.isReg() {
		return nil, errf(syscall.EINVAL, "region of non-regular inode %d", x.Ino)
	}
	if x.Count > maxRegionHashes {
		return nil, errf(syscall.E2BIG, "%d hashes in one region query", x.Count)
	}
	st := &pb.RegionState{Size: n.size, ChunkSize: uint32(s.chunkSize), Ino: n.ino}
	if c := s.exclHolder(n.ino); c != nil {
		st.Holder, st.Epoch, st.Leecher, st.Ready = c.session, c.epoch, c.leecher, c.ready
		if x.Changed && c.reported {
			st.Reported, st.Changed = true, slices.Clone(c.changed)
		}
	}
	res := &pb.Result{Region: st}
	if x.Wait && st.Holder == x.Holder && st.Epoch == x.Epoch && st.Leecher == x.Leecher && st.Ready == x.Ready {
		res.Queued = true
		return res, nil
	}
	if x.Count > 0 {
		chunks := (n.size + s.chunkSize - 1) / s.chunkSize
		end := min(chunks, x.First+uint64(x.Count))
		if x.First < end {
			st.Hashes = make([][]byte, end-x.First)
			s.chunkRange(n.ino, x.First, func(idx uint64, b *block.Block) bool {
				if idx >= end {
					return false
				}
				h := b.Hash()
				st.Hashes[idx-x.First] = h[:]
				return true
			})
		}
	}
	// Hashes and data share the one message.
	total := len(st.Hashes) * (block.HashSize + 2)
	for _, idx := range x.Fetch {
		if total >= pb.MaxMessageData {
			break
		}
		var data, hash []byte
		if b := s.chunk(n.ino, idx); b != nil && idx*s.chunkSize < n.size {
			data = b.Bytes() // sent after this returns, when nothing holds b
			h := b.Hash()
			hash = h[:]
		}
		st.Data = append(st.Data, data)
		st.Fetched = append(st.Fetched, hash)
		total += len(data)
	}
	return res, nil
}
