package client

import (
	"context"
	"errors"
	"math"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// LockEOF as a lock's End reaches past any end of file.
const LockEOF = math.MaxUint64

// Lock describes a file lock held in the cluster (docs/protocol.md,
// "Locks"): a POSIX record lock of Owner on the bytes [Start, End], or
// with Flock a flock(2) lock of the whole file. Owner is the caller's
// name for who holds it (a mount passes the kernel's lock owner); locks of
// one owner of this client never conflict with each other, and every
// owner's locks end with the client's session.
type Lock struct {
	Ino        uint64
	Owner      uint64
	Type       pb.LockType
	Start, End uint64 // End inclusive
	Flock      bool
	Pid        uint32 // reported to GetLock of other owners
}

// SetLock takes, changes or, with pb.LockType_LOCK_UNLOCK, releases a
// lock. When another owner holds one in its way the error is EAGAIN, or,
// with wait, SetLock waits its turn (first come, first served) until the
// lock is granted; a wait that would deadlock two owners is EDEADLK. If
// ctx ends while it waits, the waiter is withdrawn and the error wraps
// EINTR, unless the lock was granted meanwhile (then it is held and the
// error is nil).
func (c *Client) SetLock(ctx context.Context, l Lock, wait bool) error {
	cmd := &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{
		Ino: l.Ino, Owner: l.Owner, Type: l.Type, Start: l.Start, End: l.End,
		Flock: l.Flock, Wait: wait, Pid: l.Pid,
	}}}
	res, err := c.Do(ctx, cmd)
	if err != nil || !res.GetQueued() {
		return err
	}
	return c.awaitLock(ctx, l.Ino, cmd.Session, res.GetWaiter())
}

// awaitLock long-polls until waiter of session no longer waits; if ctx
// ends first it withdraws the waiter.
func (c *Client) awaitLock(ctx context.Context, ino, session, waiter uint64) error {
	name := locName(&pb.Loc{Ino: ino})
	q := &pb.Query{Q: &pb.Query_Lock{Lock: &pb.LockQuery{Ino: ino, Session: session, Waiter: waiter, Wait: true}}}
	for {
		if ctx.Err() != nil {
			return c.withdrawLock(ino, session, waiter)
		}
		wctx, cancel := context.WithTimeout(ctx, waitPoll)
		res, err := c.Query(wctx, q)
		cancel()
		switch {
		case err == nil && !res.GetQueued():
			// Granted, or gone with the session: a waiter leaves its
			// line no other way.
			if c.k.sess.Load().id != session {
				return pathErr("lock", name, syscall.ESTALE)
			}
			return nil
		case err == nil || errors.Is(err, ErrUnavailable):
			// Still waiting, or the poll ran out: ask again.
		default:
			if ctx.Err() != nil {
				return c.withdrawLock(ino, session, waiter)
			}
			return err
		}
	}
}

// withdrawLock drops a waiter whose caller gave up, on a context of its
// own since the caller's is done. A waiter granted in the meantime holds
// its lock, and the caller is told so (nil).
func (c *Client) withdrawLock(ino, session, waiter uint64) error {
	name := locName(&pb.Loc{Ino: ino})
	ctx, cancel := context.WithTimeout(context.Background(), c.k.cfg.retryTimeout)
	defer cancel()
	cmd := &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Ino: ino, Cancel: waiter}}}
	res, err := c.Do(ctx, cmd)
	switch {
	case err != nil:
		c.k.cfg.log.Warn("memfs: could not withdraw a lock waiter; it may be granted and held until its owner unlocks or the session ends", "ino", ino, "err", err)
	case cmd.Session != session:
		return pathErr("lock", name, syscall.ESTALE)
	case !res.GetQueued():
		return nil
	}
	return pathErr("lock", name, syscall.EINTR)
}

// GetLock returns the first lock held by another owner that stands in the
// way of l (F_GETLK), or nil when l could be taken now.
func (c *Client) GetLock(ctx context.Context, l Lock) (*pb.Lock, error) {
	res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Lock{Lock: &pb.LockQuery{
		Ino: l.Ino, Session: c.k.sess.Load().id, Owner: l.Owner, Type: l.Type,
		Start: l.Start, End: l.End, Flock: l.Flock,
	}}})
	if err != nil {
		return nil, err
	}
	return res.GetLock(), nil
}
