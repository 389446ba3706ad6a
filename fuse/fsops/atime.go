package fsops

import (
	"context"
	"log/slog"
	"sync"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Access times. Linux marks every FUSE inode S_NOATIME: the kernel leaves
// atime to the file system. With Options.Relatime the mount records the
// reads it serves as accesses (SET_ATIME_READ), which the cluster applies
// under the relatime rule: atime moves when it is not later than the last
// change or is a day old. Each move is a replicated command, so accesses
// go out in the background, at most one per inode until the inode changes
// again (forgetAccess, called where the mount drops what it cached of an
// inode), and are dropped when too many wait: an access time is never
// worth holding a read up. Reads the kernel answers from its page cache
// do not reach the mount; after a change the kernel's pages are dropped,
// so the first read after it does.

const (
	accessQueue   = 1024  // accesses waiting to go out; more are dropped
	accessSenders = 4     // accesses in flight at once
	accessMemo    = 65536 // inodes remembered as accessed; then forgotten all
	day           = 24 * time.Hour
)

type accessor struct {
	mu      sync.Mutex
	done    map[uint64]struct{} // accessed since their last change; guarded by mu
	running int                 // senders; guarded by mu
	q       chan uint64
}

func newAccessor() *accessor {
	return &accessor{done: map[uint64]struct{}{}, q: make(chan uint64, accessQueue)}
}

// accessed records a read of ino that the mount served.
func (o *ClientOps) accessed(ino uint64) {
	if !o.opt.Relatime {
		return
	}
	if a, ok := o.meta.attr(ino); ok && a.Atime.After(a.Mtime) && a.Atime.After(a.Ctime) && time.Since(a.Atime) < day {
		return // what the cluster would decide, under the capability
	}
	ac := o.acc
	ac.mu.Lock()
	if _, ok := ac.done[ino]; ok {
		ac.mu.Unlock()
		return
	}
	if len(ac.done) >= accessMemo {
		clear(ac.done)
	}
	ac.done[ino] = struct{}{}
	ac.mu.Unlock()
	select {
	case ac.q <- ino:
	default:
		o.forgetAccess(ino) // dropped: the next read tries again
		return
	}
	ac.mu.Lock()
	if ac.running < accessSenders {
		ac.running++
		go o.sendAccesses()
	}
	ac.mu.Unlock()
}

// forgetAccess makes the next read of ino count as an access again: ino
// changed (or, with ino 0, anything may have).
func (o *ClientOps) forgetAccess(ino uint64) {
	ac := o.acc
	ac.mu.Lock()
	if ino == 0 {
		clear(ac.done)
	} else {
		delete(ac.done, ino)
	}
	ac.mu.Unlock()
}

// sendAccesses sends queued accesses until none is left. A sender looks
// at the queue and leaves under the lock, so an access queued meanwhile
// finds it still counted, or starts another.
func (o *ClientOps) sendAccesses() {
	ac := o.acc
	for {
		ac.mu.Lock()
		select {
		case ino := <-ac.q:
			ac.mu.Unlock()
			o.sendAccess(ino)
		default:
			ac.running--
			ac.mu.Unlock()
			return
		}
	}
}

func (o *ClientOps) sendAccess(ino uint64) {
	ctx, cancel := o.bound(context.Background())
	defer cancel()
	start := o.meta.commit(ino)
	res, err := o.c.Do(ctx, &pb.Command{Op: &pb.Command_SetAttr{SetAttr: &pb.SetAttrCmd{
		Loc: inode(ino), Valid: uint32(pb.SetAttrBit_SET_ATIME_READ),
	}}})
	o.meta.committed(ino, res.GetAttr(), start)
	if err != nil {
		// Gone, or the cluster unreachable: a hint lost, nothing more.
		slog.Debug("fsops: access time not recorded", "ino", ino, "err", err)
		o.forgetAccess(ino)
		return
	}
	o.staleHeld(ino)
	if inv := o.invalidator(); inv != nil {
		inv.InvalidateAttr(ino) // stat shows the new atime
	}
}
