package fsops

import (
	"sync"
	"time"
)

// The kernel throws away the attributes of a reply when an invalidation of
// the inode reached it after it sent the request: it then keeps the size
// it had, and a read past that size ends there. It applies a reply in the
// thread that asked, after the mount wrote it, so the mount cannot order an
// invalidation behind a reply it gave. What it can do is need no
// invalidation where one could land in a request's way:
//
//   - an inode another client conflicts with (recalled within
//     contendedFor) is answered with no validity, so the kernel keeps
//     nothing of it, asks before each use, and a recall has nothing to
//     invalidate (where the kernel checks its pages against the attributes
//     it gets: Options.KernelChecksData);
//   - a recall invalidates only inodes the kernel may still answer about
//     from an earlier reply, and waits until the latest such reply had
//     kernelApplies to be applied: such an inode's GETATTR comes only
//     after its validity ended.

// contendedFor is how long after a recall an inode's answers carry no
// validity for the kernel: as long as another client is likely to conflict
// again.
const contendedFor = time.Second

// kernelApplies bounds how long after the mount answered the kernel may
// still be applying the answer: a thread's wake-up on a loaded machine.
const kernelApplies = 50 * time.Millisecond

// told is the latest answer with a validity that the kernel got about an
// inode.
type told struct {
	at, until time.Time
}

// kernelTold remembers what the kernel may answer about by itself, and
// which inodes were recalled lately.
type kernelTold struct {
	mu       sync.Mutex
	valid    map[uint64]told      // guarded by mu
	recalled map[uint64]time.Time // guarded by mu
	sweepAt  int                  // guarded by mu: map size that triggers a sweep
}

// tell returns the validity an answer about ino may carry, d unless ino is
// contended, and remembers it.
func (k *kernelTold) tell(ino uint64, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if r, ok := k.recalled[ino]; ok {
		if now.Sub(r) < contendedFor {
			return 0
		}
		delete(k.recalled, ino)
	}
	if k.valid == nil {
		k.valid = map[uint64]told{}
	}
	t := told{at: now, until: now.Add(d)}
	if old, ok := k.valid[ino]; ok && old.until.After(t.until) {
		t.until = old.until
	}
	k.valid[ino] = t
	k.sweepLocked(now)
	return d
}

// recall marks ino contended and says whether the kernel may still answer
// about it from an earlier reply, and when the latest of those was given.
func (k *kernelTold) recall(ino uint64) (at time.Time, holds bool) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.recalled == nil {
		k.recalled = map[uint64]time.Time{}
	}
	k.recalled[ino] = now
	t, ok := k.valid[ino]
	delete(k.valid, ino)
	k.sweepLocked(now)
	return t.at, ok && t.until.After(now)
}

// sweepLocked drops what no longer matters once the maps doubled since the
// last sweep, so that they hold about what the kernel holds.
func (k *kernelTold) sweepLocked(now time.Time) {
	if len(k.valid)+len(k.recalled) < k.sweepAt {
		return
	}
	for ino, t := range k.valid {
		if !t.until.After(now) {
			delete(k.valid, ino)
		}
	}
	for ino, r := range k.recalled {
		if now.Sub(r) >= contendedFor {
			delete(k.recalled, ino)
		}
	}
	k.sweepAt = 2*(len(k.valid)+len(k.recalled)) + 1024
}
