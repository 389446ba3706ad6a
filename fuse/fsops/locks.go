package fsops

import (
	"context"
	"math"
	"sync"
	"syscall"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Cluster-wide file locks. The kernel hands a mount that asked for them
// (the bindings' lock options) every fcntl and flock lock request; the
// mount keeps them in the cluster (client.SetLock), so they exclude
// processes on other mounts and hosts too. The session of the mount owns
// them, the kernel's lock owner tells its processes (POSIX) or open files
// (flock) apart.
//
// Data written under a lock must be seen by whoever takes the lock next:
// before any lock request the mount commits what it acknowledged for the
// file (write-behind, held attributes, its journal), and after a lock is
// granted it drops what it and the kernel cached of the file, unless it
// holds a capability on it (then nobody else changed it).

// OffsetMax is the kernel's largest file offset (OFFSET_MAX): the end of a
// lock that reaches past any end of file.
const OffsetMax = math.MaxInt64

// Lock is a file lock as the kernel passes it.
type Lock struct {
	Owner      uint64 // the kernel's lock owner
	Type       uint32 // syscall.F_RDLCK, F_WRLCK or F_UNLCK
	Start, End uint64 // End inclusive; OffsetMax or more: to the end of any file
	Pid        uint32
	// Flock: a flock(2) lock of the open file, rather than a POSIX
	// record lock of the process.
	Flock bool
}

// lockKey names the locks one owner may hold on one inode.
type lockKey struct {
	ino, owner uint64
	flock      bool
}

// lockOwners remembers who took locks through this mount, and through
// which handles, so that a close sends an unlock only for those.
type lockOwners struct {
	mu sync.Mutex
	m  map[lockKey]map[uint64]struct{} // guarded by mu: the handles each owner locked through
}

func (l *lockOwners) add(k lockKey, handle uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[lockKey]map[uint64]struct{}{}
	}
	if l.m[k] == nil {
		l.m[k] = map[uint64]struct{}{}
	}
	l.m[k][handle] = struct{}{}
}

// take reports whether k took a lock, and forgets it.
func (l *lockOwners) take(k lockKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[k]
	delete(l.m, k)
	return ok
}

// takeHandle forgets and returns the POSIX owners that locked ino through
// handle and were not closed since. At the last close of a handle these
// are the open file description locks (F_OFD_SETLK), whose owner is the
// open file: the kernel passes them as POSIX locks, and the FLUSH of a
// close names the process, never the file, so nothing else ends them. A
// process that locked through the handle has closed it by then, and its
// FLUSH forgot it.
func (l *lockOwners) takeHandle(ino, handle uint64) []lockKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []lockKey
	for k, hs := range l.m {
		if _, ok := hs[handle]; ok && k.ino == ino && !k.flock {
			out = append(out, k)
			delete(l.m, k)
		}
	}
	return out
}

// clusterLock converts a kernel lock; an unknown type is EINVAL.
func clusterLock(ino uint64, lk Lock) (client.Lock, syscall.Errno) {
	l := client.Lock{Ino: ino, Owner: lk.Owner, Start: lk.Start, End: lk.End, Flock: lk.Flock, Pid: lk.Pid}
	switch lk.Type {
	case syscall.F_RDLCK:
		l.Type = pb.LockType_LOCK_READ
	case syscall.F_WRLCK:
		l.Type = pb.LockType_LOCK_WRITE
	case syscall.F_UNLCK:
		l.Type = pb.LockType_LOCK_UNLOCK
	default:
		return l, syscall.EINVAL
	}
	if l.End >= OffsetMax {
		l.End = client.LockEOF
	}
	if l.Start > l.End {
		return l, syscall.EINVAL
	}
	return l, 0
}

// GetLk implements Ops: the first lock of another owner in lk's way, or
// lk with Type F_UNLCK. The process of a lock held through another mount
// means nothing on this host: its Pid is 0.
func (o *ClientOps) GetLk(ctx context.Context, ino, _ uint64, lk Lock) (out Lock, e syscall.Errno) {
	l, e := clusterLock(ino, lk)
	if e != 0 {
		return lk, e
	}
	ctx, cancel := o.bound(ctx)
	defer cancel()
	held, err := o.c.GetLock(ctx, l)
	if err != nil {
		return lk, errnoOf("getlk", err)
	}
	out = lk
	if held == nil {
		out.Type = syscall.F_UNLCK
		return out, 0
	}
	out.Type, out.Start, out.End, out.Pid = syscall.F_RDLCK, held.GetStart(), held.GetEnd(), 0
	if held.GetType() == pb.LockType_LOCK_WRITE {
		out.Type = syscall.F_WRLCK
	}
	if out.End >= OffsetMax {
		out.End = OffsetMax
	}
	if held.GetSession() == o.c.Session() {
		out.Pid = held.GetPid()
	}
	return out, 0
}

// SetLk implements Ops. A wait is not bounded by the operation timeout:
// it lasts until the lock is granted or ctx is cancelled (the kernel's
// interrupt, when the process gets a signal), which answers EINTR.
func (o *ClientOps) SetLk(ctx context.Context, ino, handle uint64, lk Lock, wait bool) (e syscall.Errno) {
	l, e := clusterLock(ino, lk)
	if e != 0 {
		return e
	}
	o.commitForLock(ino)
	if l.Type != pb.LockType_LOCK_UNLOCK {
		o.locks.add(lockKey{ino, lk.Owner, lk.Flock}, handle)
	}
	if !wait {
		var cancel context.CancelFunc
		ctx, cancel = o.bound(context.WithoutCancel(ctx))
		defer cancel()
	}
	if err := o.c.SetLock(ctx, l, wait); err != nil {
		e := client.Errno(err)
		if e == syscall.EAGAIN && lk.Flock {
			// flock(2) converts a lock by dropping it first, so one
			// refused under LOCK_NB leaves the owner none (Linux and
			// BSD do so; the cluster changes nothing on a refusal).
			l.Type = pb.LockType_LOCK_UNLOCK
			_ = o.c.SetLock(ctx, l, false)
		}
		return e
	}
	if l.Type != pb.LockType_LOCK_UNLOCK {
		o.lockGranted(ino)
	}
	return 0
}

// ReleaseLocks implements Ops: what owner holds on ino goes, POSIX locks
// at every close of a descriptor (FLUSH), flock locks at the last close of
// the open file (RELEASE). An owner that took no lock through this mount
// costs nothing.
func (o *ClientOps) ReleaseLocks(ctx context.Context, ino, owner uint64, flock bool) (e syscall.Errno) {
	if !o.locks.take(lockKey{ino, owner, flock}) {
		return 0
	}
	return o.unlockAll(ctx, ino, owner, flock)
}

// releaseOFDLocks ends the open file description locks taken through
// handle, at its last close (lockOwners.takeHandle).
func (o *ClientOps) releaseOFDLocks(ctx context.Context, ino, handle uint64) {
	for _, k := range o.locks.takeHandle(ino, handle) {
		_ = o.unlockAll(ctx, ino, k.owner, false)
	}
}

// unlockAll releases every lock of owner's kind on ino.
func (o *ClientOps) unlockAll(ctx context.Context, ino, owner uint64, flock bool) syscall.Errno {
	o.commitForLock(ino)
	ctx, cancel := o.bound(context.WithoutCancel(ctx))
	defer cancel()
	l := client.Lock{Ino: ino, Owner: owner, Type: pb.LockType_LOCK_UNLOCK, End: client.LockEOF, Flock: flock}
	return errnoOf("unlock", o.c.SetLock(ctx, l, false))
}

// commitForLock commits what this mount acknowledged for ino, so that the
// next holder of a lock sees what was written under it. A failure is
// recorded on the handles and reported by fsync and close.
func (o *ClientOps) commitForLock(ino uint64) {
	o.barrier(ino)
	_ = o.syncJournal(context.Background(), ino)
}

// lockGranted drops what this mount and the kernel cached of ino's data,
// which another host may have changed under the lock before, unless the
// mount holds a capability on ino.
func (o *ClientOps) lockGranted(ino uint64) {
	if o.meta.on() && o.meta.caps.Held(ino) {
		return
	}
	o.dropWindows(ino)
	if inv := o.invalidator(); inv != nil {
		inv.InvalidateData(ino)
	}
}
