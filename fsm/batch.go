package fsm

import (
	"fmt"
	"math"
	"slices"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Batches. A session holding exclusive capabilities answers operations
// itself and sends them later, in order, as one BatchCmd: all of them
// apply or none does, so a holder that crashed leaves a prefix of what it
// answered, never a gap. The batch is fenced by the capabilities it was
// built under: once one of them is gone (revoked, or released and granted
// again) someone else may have changed what the holder answered from, and
// the batch is refused whole. Granted again while held, it is not gone.
//
// A batch applies its commands on the entry's transaction after a
// savepoint (save), and on failure restores it (rollback). The trees are
// persistent, so a savepoint costs committing their transactions; the
// block store keeps its reference counts outside them, so while a batch
// runs every reference it takes is logged and every release is put off
// (blockLog), and a rollback drops exactly the references taken.

const (
	maxBatch = 4096
	// stampWindow is how far before its entry's time a command of a batch
	// may be stamped: a holder sends what it answered within a few
	// seconds (at fsync, recall or a full journal), so an older stamp is
	// a wrong clock, and a later one would put times ahead of the log.
	stampWindow = int64(60 * time.Second)
)

func (t *tx) batch(x *pb.BatchCmd, sess *session) (*pb.Result, error) {
	switch {
	case sess == nil:
		return nil, errf(syscall.ESTALE, "batch needs a session")
	case len(x.Commands) > maxBatch:
		return nil, errf(syscall.E2BIG, "batch of %d commands (at most %d)", len(x.Commands), maxBatch)
	}
	if err := t.checkFences(x.Fences, sess.id); err != nil {
		return nil, err
	}
	for i, c := range x.Commands {
		if err := nestable(c); err != nil {
			return failedAt(i, c, err), nil
		}
	}
	sp := t.save()
	t.blog = &blockLog{}
	defer func() {
		t.blog = nil
		t.stamp = t.now
	}()
	res := &pb.Result{Results: make([]*pb.Result, 0, len(x.Commands))}
	for i, c := range x.Commands {
		t.stamp = t.stampFor(c.StampNs)
		r, err := t.nested(c, sess.id)
		if err == errRecall {
			t.rollback(sp, true)
			return nil, err
		}
		if err != nil {
			t.rollback(sp, false)
			return failedAt(i, c, err), nil
		}
		if r == nil {
			r = &pb.Result{}
		}
		res.Results = append(res.Results, r)
	}
	t.blog.settle(t.blocks)
	return res, nil
}

// nested runs one command of a batch of session id. A panic (a bug, never
// expected) fails the command with EIO, so that the batch rolls back
// rather than leaving half its commands applied.
func (t *tx) nested(c *pb.Command, id uint64) (r *pb.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, errf(syscall.EIO, "internal error: %v", p)
		}
	}()
	// The session as the batch's earlier commands left it (its
	// reservations change as creates use them).
	return t.exec(c, t.session(id))
}

// failedAt is the result of a batch whose command i failed with err.
func failedAt(i int, c *pb.Command, err error) *pb.Result {
	r := errResult(err)
	r.Failed = uint32(i + 1)
	r.Message = fmt.Sprintf("command %d of the batch (%s): %s", i+1, opName(c), r.Message)
	return r
}

// opName names c's operation as the schema does ("mkdir").
func opName(c *pb.Command) string {
	if c == nil {
		return "nil"
	}
	m := c.ProtoReflect()
	if fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("op")); fd != nil {
		return string(fd.Name())
	}
	return "no operation"
}

// nestable checks that c may be a command of a batch: one of the
// operations a holder answers itself, without a retry identity of its
// own (the batch's is the only one).
func nestable(c *pb.Command) error {
	if c == nil || c.Op == nil {
		return errf(syscall.EINVAL, "no operation")
	}
	if c.Session != 0 || c.Seq != 0 || c.Ack != 0 {
		return errf(syscall.EINVAL, "session, seq and ack belong to the batch")
	}
	switch c.Op.(type) {
	case *pb.Command_Open, *pb.Command_Close, *pb.Command_Write, *pb.Command_Mkdir,
		*pb.Command_Remove, *pb.Command_Rename, *pb.Command_SetAttr, *pb.Command_Symlink,
		*pb.Command_Mknod, *pb.Command_Link, *pb.Command_SetXattr, *pb.Command_RemoveXattr:
		return nil
	}
	return errf(syscall.EINVAL, "not allowed in a batch")
}

// checkFences refuses a batch unless session still holds every fence
// (ino, e): an exclusive capability on ino whose tenure began at or before
// e and whose epoch is e or later. Its holding never broke since e, so no
// other session changed the inode after the holder answered under e; a
// re-grant in between (a listing's grant with entries, say) moved the
// epoch only. A recalled one not yet revoked still counts: the holder is
// sending what it answered under it, which is what the recall asks for.
func (t *tx) checkFences(fences []*pb.CapRef, session uint64) error {
	for _, f := range fences {
		c, ok := t.caps.get(pairKey(f.GetIno(), session))
		switch {
		case !ok:
			return errf(syscall.EKEYREVOKED, "no capability on inode %d", f.GetIno())
		case f.GetEpoch() < c.since || f.GetEpoch() > c.epoch:
			return errf(syscall.EKEYREVOKED, "the capability on inode %d is held since epoch %d (last granted at %d), not at %d", f.GetIno(), c.since, c.epoch, f.GetEpoch())
		case !c.excl:
			return errf(syscall.EKEYREVOKED, "the capability on inode %d is not exclusive", f.GetIno())
		}
	}
	return nil
}

// stampFor is the time a command of a batch stamped ns sets: ns when it
// lies within stampWindow before the entry's time, else the entry's time.
func (t *tx) stampFor(ns int64) int64 {
	lo := t.now - stampWindow
	if lo > t.now { // overflowed
		lo = math.MinInt64
	}
	if ns >= lo && ns <= t.now {
		return ns
	}
	return t.now
}

// savepoint is a transaction's state at one moment, to go back to.
type savepoint struct {
	st                       state
	capsGone                 bool
	inodes, entries, recalls int // lengths of the change lists
	recalled                 int // len(t.recalled)
}

// save takes a savepoint. The trees' transactions are committed, so the
// saved trees no longer change; the copies that handlers change in place
// are forgotten, so changes from here on copy again.
func (t *tx) save() savepoint {
	t.commit()
	t.fresh, t.freshSess = nil, nil
	sp := savepoint{st: t.state, capsGone: t.capsGone, recalled: len(t.recalled)}
	if t.ev != nil {
		sp.inodes, sp.entries, sp.recalls = len(t.ev.inodes), len(t.ev.entries), len(t.ev.recalls)
	}
	return sp
}

// rollback returns to sp and drops the block references taken since.
// With recalls, the recalls made since stay made (announced, and timed
// for revocation), as those of a single command refused for a recall do.
func (t *tx) rollback(sp savepoint, recalls bool) {
	since := slices.Clone(t.recalled[sp.recalled:])
	t.recalled = t.recalled[:sp.recalled]
	t.state = sp.st
	t.fresh, t.freshSess = nil, nil
	t.capsGone = sp.capsGone
	if t.ev != nil {
		t.ev.inodes, t.ev.entries = t.ev.inodes[:sp.inodes], t.ev.entries[:sp.entries]
		if !recalls {
			t.ev.recalls = t.ev.recalls[:sp.recalls]
		}
	}
	if t.blog != nil {
		t.blog.undo(t.blocks)
		t.blog = &blockLog{}
	}
	if !recalls {
		return
	}
	for _, c := range since {
		if cur, ok := t.caps.get(pairKey(c.ino, c.session)); ok && cur.epoch == c.epoch && cur.revokeAt == 0 {
			t.putCap(c)
			t.recalled = append(t.recalled, c)
		}
	}
}

// blockLog is the block store's side of a running batch: the references
// it took, and the releases it put off until it succeeds.
type blockLog struct {
	taken    []*block.Block
	released []*block.Block
	pending  map[*block.Block]int64 // releases put off, per block
}

// settle carries out the put-off releases: the batch succeeded.
func (l *blockLog) settle(s *block.Store) {
	for _, b := range l.released {
		s.Release(b)
	}
	*l = blockLog{}
}

// undo drops the references the batch took: it rolled back.
func (l *blockLog) undo(s *block.Store) {
	for _, b := range l.taken {
		s.Release(b)
	}
	*l = blockLog{}
}

// Block references go through these, so that a batch can undo them.

func (t *tx) putBlock(h block.Hash, data []byte) *block.Block {
	return t.took(t.blocks.PutHashed(h, data))
}

func (t *tx) adoptBlock(h block.Hash, data []byte) *block.Block {
	return t.took(t.blocks.Adopt(h, data))
}

func (t *tx) refBlock(b *block.Block) {
	t.blocks.RefBlock(b)
	t.took(b)
}

func (t *tx) took(b *block.Block) *block.Block {
	if t.blog != nil {
		t.blog.taken = append(t.blog.taken, b)
	}
	return b
}

// releaseBlock drops a reference, or in a batch puts that off.
func (t *tx) releaseBlock(b *block.Block) {
	if t.blog == nil {
		t.blocks.Release(b)
		return
	}
	t.blog.released = append(t.blog.released, b)
	if t.blog.pending == nil {
		t.blog.pending = make(map[*block.Block]int64)
	}
	t.blog.pending[b]++
}

// blockRefs is b's reference count with the releases put off counted as
// done.
func (t *tx) blockRefs(b *block.Block) int64 {
	n := t.blocks.Refs(b)
	if t.blog != nil {
		n -= t.blog.pending[b]
	}
	return n
}

// pendingFree is the bytes the releases put off will free, but for
// blocks with a hash in kept (a plan stores that content again).
func (t *tx) pendingFree(kept map[block.Hash]bool) uint64 {
	if t.blog == nil {
		return 0
	}
	var n uint64
	for b := range t.blog.pending {
		if t.blockRefs(b) <= 0 && !kept[b.Hash()] {
			n += uint64(b.Len())
		}
	}
	return n
}
