package fsm

import (
	"slices"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Reserved inode numbers. A holder of exclusive capabilities answers
// creates itself and sends them to the cluster later (BatchCmd), yet its
// program learns the new inode's number and generation at once. So the
// holder reserves numbers ahead (ReserveInodesCmd): nobody else takes
// them, and a create of its session names one (the ino field of OpenCmd,
// MkdirCmd, MknodCmd and SymlinkCmd). The generation of an inode made
// from a reservation is the reservation's log index, which the holder
// knows as well.
//
// Numbers of one reservation are taken in ascending order, so it is kept
// as the range still free: a number below one already taken is refused
// even if it was skipped, and no set of used numbers has to be kept.

// inoRange is the part of a reservation not used yet: [next, end).
type inoRange struct {
	next, end uint64
	epoch     uint64 // log index of the reservation: the generation of its inodes
}

const (
	maxReserve = 1 << 16 // numbers per reservation
	// maxRanges bounds a session's reservations. A fifth is refused
	// (E2BIG) rather than made by dropping the oldest: the holder may
	// have handed out numbers of every one it holds, and a create naming
	// a dropped number would fail, with its whole batch, long after.
	maxRanges = 4
)

func (t *tx) reserveInodes(x *pb.ReserveInodesCmd, sess *session) (*pb.Result, error) {
	switch {
	case sess == nil:
		return nil, errf(syscall.ESTALE, "reserve_inodes needs a session")
	case x.Count == 0 || x.Count > maxReserve:
		return nil, errf(syscall.EINVAL, "reservation of %d inode numbers (1 to %d)", x.Count, maxReserve)
	case len(sess.ranges) >= maxRanges:
		return nil, errf(syscall.E2BIG, "session %d holds %d reservations already", sess.id, len(sess.ranges))
	}
	s := t.sessMut(sess)
	first := t.nextIno
	t.nextIno += uint64(x.Count)
	s.ranges = append(s.ranges, inoRange{next: first, end: t.nextIno, epoch: t.index})
	return &pb.Result{FirstIno: first, Epoch: t.index, N: uint64(x.Count)}, nil
}

// checkReserved validates ino, named by a creating command of sess: 0
// (the cluster chooses) or a number sess reserved and has not passed.
func checkReserved(sess *session, ino uint64) error {
	if ino == 0 || reservedIn(sess, ino) >= 0 {
		return nil
	}
	return errf(syscall.EINVAL, "inode number %d is not reserved by this session, or not above the last one used", ino)
}

// reservedIn returns the position of the range of sess that holds ino,
// or -1.
func reservedIn(sess *session, ino uint64) int {
	if sess == nil {
		return -1
	}
	return slices.IndexFunc(sess.ranges, func(r inoRange) bool { return ino >= r.next && ino < r.end })
}

// takeReserved uses ino, checked by checkReserved, from the running
// command's session and returns the generation its inode gets. A range
// used up is dropped.
func (t *tx) takeReserved(ino uint64) (uint64, bool) {
	s := t.session(t.cmdSession)
	if reservedIn(s, ino) < 0 {
		return 0, false
	}
	s = t.sessMut(s)
	i := reservedIn(s, ino)
	r := &s.ranges[i]
	r.next = ino + 1
	epoch := r.epoch
	if r.next == r.end {
		s.ranges = slices.Delete(s.ranges, i, i+1)
	}
	return epoch, true
}
