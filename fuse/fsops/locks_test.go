package fsops

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// TestLocksThroughOps: the kernel's view of locks (OFFSET_MAX ends,
// F_* types, lock owners) maps onto the cluster's, a close releases only
// its owner's locks of its kind, and writes made under a lock are
// committed before it is released.
func TestLocksThroughOps(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	ino, h := a.Ino, out.Handle
	whole := Lock{Owner: 7, Type: syscall.F_WRLCK, Start: 0, End: OffsetMax, Pid: 42}

	require.Zero(t, ops.SetLk(ctx, ino, h, whole, false))
	theirs := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_READ, Start: 1 << 50, End: 1 << 50}
	require.ErrorIs(t, other.SetLock(ctx, theirs, false), syscall.EAGAIN, "OFFSET_MAX must reach past any end of file")

	// F_GETLK from this mount for another owner names the lock, with
	// its process (held through this mount), ending at OFFSET_MAX.
	got, e := ops.GetLk(ctx, ino, h, Lock{Owner: 8, Type: syscall.F_RDLCK, Start: 5, End: 5})
	require.Zero(t, e)
	require.Equal(t, Lock{Owner: 8, Type: syscall.F_WRLCK, Start: 0, End: OffsetMax, Pid: 42}, got)
	got, e = ops.GetLk(ctx, ino, h, Lock{Owner: 7, Type: syscall.F_RDLCK, Start: 5, End: 5})
	require.Zero(t, e)
	require.Equal(t, uint32(syscall.F_UNLCK), got.Type, "an owner never conflicts with itself")

	// Writes under the lock are in the cluster before it goes.
	n, e := ops.Write(ctx, ino, h, 0, []byte("under the lock"))
	require.Zero(t, e)
	require.Equal(t, 14, n)
	// Closing as another owner, or releasing flock locks, keeps it.
	require.Zero(t, ops.ReleaseLocks(ctx, ino, 8, false))
	require.Zero(t, ops.ReleaseLocks(ctx, ino, 7, true))
	require.ErrorIs(t, other.SetLock(ctx, theirs, false), syscall.EAGAIN)
	require.Zero(t, ops.ReleaseLocks(ctx, ino, 7, false))
	require.NoError(t, other.SetLock(ctx, theirs, false))
	data, err := other.ReadFile("/f")
	require.NoError(t, err)
	require.Equal(t, "under the lock", string(data))

	for _, bad := range []Lock{
		{Owner: 7, Type: 99, End: 1},
		{Owner: 7, Type: syscall.F_RDLCK, Start: 10, End: 9},
	} {
		require.Equal(t, syscall.EINVAL, ops.SetLk(ctx, ino, h, bad, false))
		_, e := ops.GetLk(ctx, ino, h, bad)
		require.Equal(t, syscall.EINVAL, e)
	}
}

// TestLockWaitCancelled: a wait ends with EINTR when its context is
// cancelled (the kernel's interrupt), and concurrent lockers of one mount
// (owners of one session) exclude each other like processes.
func TestLockWaitCancelled(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	ino, h := a.Ino, out.Handle
	theirs := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_WRITE, End: client.LockEOF}
	require.NoError(t, other.SetLock(ctx, theirs, false))
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.Equal(t, syscall.EINTR, ops.SetLk(wctx, ino, h, Lock{Owner: 3, Type: syscall.F_WRLCK, End: OffsetMax}, true))
	theirs.Type = pb.LockType_LOCK_UNLOCK
	require.NoError(t, other.SetLock(ctx, theirs, false))

	// Owners of this mount take turns at a counter kept in memory: one
	// of them inside at a time.
	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	for owner := range uint64(4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				lk := Lock{Owner: 100 + owner, Type: syscall.F_WRLCK, End: OffsetMax}
				if e := ops.SetLk(ctx, ino, h, lk, true); e != 0 {
					t.Errorf("lock: %v", e)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond) // stay inside while others try
				mu.Lock()
				inside--
				mu.Unlock()
				lk.Type = syscall.F_UNLCK
				if e := ops.SetLk(ctx, ino, h, lk, false); e != 0 {
					t.Errorf("unlock: %v", e)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, most)
}

// TestLocksOnBufferedFile: a file the mount made and has not sent yet
// (buffered under an exclusive capability) can be tested and locked at
// once: the lock's query and command send the journal first (sqlite's
// F_GETLK on the -shm file it has just created).
func TestLocksOnBufferedFile(t *testing.T) {
	ops, c, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	_, e = ops.Mkdir(ctx, d.Ino, "warm", 0o755, root) // takes the directory exclusively
	require.Zero(t, e)
	before := c.Calls()
	a, out, e := ops.Create(ctx, d.Ino, "shm", syscall.O_RDWR|syscall.O_EXCL, 0o644, root)
	require.Zero(t, e)
	require.Equal(t, before.Commands, c.Calls().Commands, "the create was not buffered")

	got, e := ops.GetLk(ctx, a.Ino, out.Handle, Lock{Owner: 1, Type: syscall.F_WRLCK, End: OffsetMax})
	require.Zero(t, e)
	require.Equal(t, uint32(syscall.F_UNLCK), got.Type)
	require.Zero(t, ops.SetLk(ctx, a.Ino, out.Handle, Lock{Owner: 1, Type: syscall.F_WRLCK, End: OffsetMax}, false))
	theirs := client.Lock{Ino: a.Ino, Owner: 1, Type: pb.LockType_LOCK_READ, End: client.LockEOF}
	require.ErrorIs(t, other.SetLock(ctx, theirs, false), syscall.EAGAIN)
}
