package fsm

import (
	"math"
	"slices"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// File locks: POSIX record locks (fcntl F_SETLK, F_SETLKW, F_GETLK) and
// flock(2) locks, kept in the replicated state so that they exclude each
// other across mounts and hosts as they do between processes of one host.
// A lock belongs to a session and a lock owner within it (for a mount, the
// kernel's lock owner: the process's file table for POSIX locks, the open
// file description for flock); the two kinds never conflict with each
// other, as on Linux. Locks go with their session (its lease) and their
// inode; they never change an inode, so no capability stands in their way.

// lockEOF as a lock's end reaches past any end of file.
const lockEOF = math.MaxUint64

// maxFileLocks bounds the locks held and waited for on one inode, so that
// a client cannot grow one record without end.
const maxFileLocks = 4096

// maxDeadlockDepth is how many owners a deadlock search follows, as
// Linux's posix_locks_deadlock does.
const maxDeadlockDepth = 10

// lockRec is one lock, held or waited for. end is inclusive.
type lockRec struct {
	session, owner uint64
	start, end     uint64
	waiter         uint64 // the waiter's number while it waits; 0 when held
	pid            uint32
	write          bool
	bsd            bool // a flock(2) lock: the whole file, a name space of its own
}

// fileLocks is the lock state of one inode: the locks held, in the order
// they were taken, and the waiters in the order they came. Immutable once
// published, like every value in a tree.
type fileLocks struct {
	held    []lockRec
	waiting []lockRec
}

func (a *lockRec) sameOwner(b *lockRec) bool {
	return a.session == b.session && a.owner == b.owner && a.bsd == b.bsd
}

func (a *lockRec) overlaps(b *lockRec) bool { return a.start <= b.end && b.start <= a.end }

// touches: the two ranges overlap or one ends right before the other.
func (a *lockRec) touches(b *lockRec) bool {
	return a.overlaps(b) || (a.end != lockEOF && a.end+1 == b.start) || (b.end != lockEOF && b.end+1 == a.start)
}

func (a *lockRec) conflicts(b *lockRec) bool {
	return a.bsd == b.bsd && !(a.session == b.session && a.owner == b.owner) &&
		(a.write || b.write) && a.overlaps(b)
}

func (a *lockRec) typ() pb.LockType {
	if a.write {
		return pb.LockType_LOCK_WRITE
	}
	return pb.LockType_LOCK_READ
}

func (a *lockRec) proto() *pb.Lock {
	return &pb.Lock{Type: a.typ(), Start: a.start, End: a.end, Pid: a.pid, Session: a.session, Owner: a.owner}
}

// without returns held less r's owner's locks on r's range: a lock that
// sticks out on either side keeps what sticks out.
func without(held []lockRec, r *lockRec) []lockRec {
	out := make([]lockRec, 0, len(held)+1)
	for _, h := range held {
		if !h.sameOwner(r) || !h.overlaps(r) {
			out = append(out, h)
			continue
		}
		if h.start < r.start {
			lo := h
			lo.end = r.start - 1
			out = append(out, lo)
		}
		if h.end > r.end {
			hi := h
			hi.start = r.end + 1
			out = append(out, hi)
		}
	}
	return out
}

// with returns held with r taken by its owner: the owner's locks on r's
// range give way to it, and those of the same type it touches merge with
// it, so an owner never holds two locks that overlap.
func with(held []lockRec, r lockRec) []lockRec {
	r.waiter = 0
	out := make([]lockRec, 0, len(held)+1)
	for _, h := range held {
		if h.sameOwner(&r) && h.write == r.write && h.touches(&r) {
			r.start, r.end = min(r.start, h.start), max(r.end, h.end)
			continue
		}
		out = append(out, h)
	}
	return append(without(out, &r), r)
}

// blockers returns the locks of held that stand in r's way.
func blockers(held []lockRec, r *lockRec) []lockRec {
	var out []lockRec
	for i := range held {
		if held[i].conflicts(r) {
			out = append(out, held[i])
		}
	}
	return out
}

func (s *state) fileLocks(ino uint64) *fileLocks {
	var k [8]byte
	be.PutUint64(k[:], ino)
	l, _ := s.rlocks.get(k[:])
	return l
}

// putLocks stores the lock state of ino, or forgets it when empty.
func (t *tx) putLocks(ino uint64, fl *fileLocks) {
	if len(fl.held) == 0 && len(fl.waiting) == 0 {
		t.rlocks.del(u64key(ino))
		return
	}
	t.rlocks.put(u64key(ino), fl)
}

// lockRequest validates what a command or query asks for.
func lockRequest(typ pb.LockType, start, end uint64, bsd bool) (lockRec, error) {
	if typ < pb.LockType_LOCK_UNLOCK || typ > pb.LockType_LOCK_WRITE {
		return lockRec{}, errf(syscall.EINVAL, "lock type %d", typ)
	}
	if bsd {
		start, end = 0, lockEOF
	}
	if start > end {
		return lockRec{}, errf(syscall.EINVAL, "lock range %d-%d", start, end)
	}
	return lockRec{start: start, end: end, write: typ == pb.LockType_LOCK_WRITE, bsd: bsd}, nil
}

// lockCmd takes, changes or releases a lock, or queues a waiter for it.
func (t *tx) lockCmd(x *pb.LockCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "lock needs a session")
	}
	if x.Cancel != 0 {
		return t.cancelWaiter(x.Ino, x.Cancel, sess.id), nil
	}
	n, err := t.lookup(&pb.Loc{Ino: x.Ino})
	if err != nil {
		return nil, err
	}
	r, err := lockRequest(x.Type, x.Start, x.End, x.Flock)
	if err != nil {
		return nil, err
	}
	r.session, r.owner, r.pid = sess.id, x.Owner, x.Pid
	fl := &fileLocks{}
	if old := t.fileLocks(n.ino); old != nil {
		fl.held, fl.waiting = old.held, old.waiting
	}
	if x.Type == pb.LockType_LOCK_UNLOCK {
		fl.held = without(fl.held, &r)
		t.settle(n.ino, fl)
		return &pb.Result{}, nil
	}
	rest := fl.held
	if r.bsd {
		for _, h := range fl.held {
			if h.sameOwner(&r) && h.write == r.write {
				return &pb.Result{}, nil // already held as asked
			}
		}
		// flock converts by giving up the old lock first (Linux does
		// the same), so two holders upgrading at once do not deadlock.
		rest = without(fl.held, &r)
	}
	in := blockers(rest, &r)
	if len(in) == 0 {
		if len(fl.held)+len(fl.waiting) >= maxFileLocks {
			return nil, errf(syscall.ENOLCK, "inode %d has %d locks", n.ino, maxFileLocks)
		}
		fl.held = with(rest, r)
		t.settle(n.ino, fl)
		return &pb.Result{}, nil
	}
	switch {
	case !x.Wait:
		return nil, errf(syscall.EAGAIN, "inode %d: bytes %d-%d are locked by session %d", n.ino, in[0].start, in[0].end, in[0].session)
	case !r.bsd && t.deadlock(&r, in):
		return nil, errf(syscall.EDEADLK, "inode %d: waiting would deadlock", n.ino)
	case len(fl.held)+len(fl.waiting) >= maxFileLocks:
		return nil, errf(syscall.ENOLCK, "inode %d has %d locks", n.ino, maxFileLocks)
	}
	r.waiter = t.nextHandle
	t.nextHandle++
	fl.held = rest
	fl.waiting = append(slices.Clip(fl.waiting), r)
	t.settle(n.ino, fl)
	return &pb.Result{Queued: true, Waiter: r.waiter}, nil
}

// settle grants, in the order they came, the waiters of ino that nothing
// holds up any longer, and stores the result. fl is the entry's own.
func (t *tx) settle(ino uint64, fl *fileLocks) {
	var still []lockRec
	for _, w := range fl.waiting {
		if len(blockers(fl.held, &w)) > 0 {
			still = append(still, w)
			continue
		}
		fl.held = with(fl.held, w)
	}
	fl.waiting = still
	t.putLocks(ino, fl)
}

// cancelWaiter drops a waiter of session sess that still waits (its
// program was interrupted): queued in the result says it was dropped.
func (t *tx) cancelWaiter(ino, waiter, sess uint64) *pb.Result {
	old := t.fileLocks(ino)
	if old == nil {
		return &pb.Result{}
	}
	i := slices.IndexFunc(old.waiting, func(w lockRec) bool { return w.waiter == waiter && w.session == sess })
	if i < 0 {
		return &pb.Result{}
	}
	fl := &fileLocks{held: old.held, waiting: slices.Delete(slices.Clone(old.waiting), i, i+1)}
	t.settle(ino, fl)
	return &pb.Result{Queued: true}
}

// dropLocks releases every lock and waiter of session id (its session
// ended) and grants what that frees.
func (t *tx) dropLocks(id uint64) {
	var inos []uint64
	t.rlocks.root().Walk(func(k []byte, fl *fileLocks) bool {
		mine := func(r lockRec) bool { return r.session == id }
		if slices.ContainsFunc(fl.held, mine) || slices.ContainsFunc(fl.waiting, mine) {
			inos = append(inos, be.Uint64(k))
		}
		return false
	})
	for _, ino := range inos {
		old := t.fileLocks(ino)
		mine := func(r lockRec) bool { return r.session == id }
		t.settle(ino, &fileLocks{
			held:    slices.DeleteFunc(slices.Clone(old.held), mine),
			waiting: slices.DeleteFunc(slices.Clone(old.waiting), mine),
		})
	}
}

// deadlock reports whether r waiting for the owners of in would close a
// cycle: one of them waits, directly or through others, for a lock r's
// owner holds. POSIX locks only, as on Linux.
func (s *state) deadlock(r *lockRec, in []lockRec) bool {
	type owner struct{ session, owner uint64 }
	me := owner{r.session, r.owner}
	var frontier []owner
	for _, b := range in {
		frontier = append(frontier, owner{b.session, b.owner})
	}
	seen := make(map[owner]bool)
	for range maxDeadlockDepth {
		var next []owner
		for _, o := range frontier {
			if o == me {
				return true
			}
			if seen[o] {
				continue
			}
			seen[o] = true
			s.rlocks.root().Walk(func(_ []byte, fl *fileLocks) bool {
				for i := range fl.waiting {
					w := &fl.waiting[i]
					if w.bsd || w.session != o.session || w.owner != o.owner {
						continue
					}
					for _, b := range blockers(fl.held, w) {
						next = append(next, owner{b.session, b.owner})
					}
				}
				return false
			})
		}
		if len(next) == 0 {
			return false
		}
		frontier = next
	}
	return false
}

// lockQuery answers F_GETLK, or whether a waiter still waits. A waiter
// that no longer waits was granted, unless its session or inode is gone
// (which took it along): then the answer is ESTALE or ENOENT, never a
// grant.
func (s *state) lockQuery(x *pb.LockQuery) (*pb.Result, error) {
	fl := s.fileLocks(x.Ino)
	if x.Waiter != 0 {
		switch {
		case fl != nil && slices.ContainsFunc(fl.waiting, func(w lockRec) bool { return w.waiter == x.Waiter && w.session == x.Session }):
			return &pb.Result{Queued: true, Waiter: x.Waiter}, nil
		case s.session(x.Session) == nil:
			return nil, errf(syscall.ESTALE, "session %d is unknown or expired", x.Session)
		case s.inode(x.Ino) == nil:
			return nil, errf(syscall.ENOENT, "inode %d", x.Ino)
		}
		return &pb.Result{}, nil
	}
	if _, err := s.lookup(&pb.Loc{Ino: x.Ino}); err != nil {
		return nil, err
	}
	r, err := lockRequest(x.Type, x.Start, x.End, x.Flock)
	if err != nil {
		return nil, err
	}
	if x.Type == pb.LockType_LOCK_UNLOCK {
		return nil, errf(syscall.EINVAL, "testing an unlock")
	}
	r.session, r.owner = x.Session, x.Owner
	if fl != nil {
		if in := blockers(fl.held, &r); len(in) > 0 {
			return &pb.Result{Lock: in[0].proto()}, nil
		}
	}
	return &pb.Result{}, nil
}
