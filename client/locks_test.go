package client_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

func wrLock(ino, owner uint64) client.Lock {
	return client.Lock{Ino: ino, Owner: owner, Type: pb.LockType_LOCK_WRITE, Start: 0, End: client.LockEOF}
}

// lockAsync runs SetLock with wait in the background.
func lockAsync(ctx context.Context, c *client.Client, l client.Lock) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.SetLock(ctx, l, true) }()
	return done
}

// TestLocksAcrossClients: two clients (two sessions, as two mounts on two
// hosts) exclude each other, a waiter is woken by the holder's unlock, and
// F_GETLK names the holder.
func TestLocksAcrossClients(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	a, b := connect(t, cl), connect(t, cl)
	ctx := t.Context()
	ino := putIno(t, a, "/db", "data")

	require.NoError(t, a.SetLock(ctx, wrLock(ino, 1), false))
	require.ErrorIs(t, b.SetLock(ctx, wrLock(ino, 1), false), syscall.EAGAIN)
	held, err := b.GetLock(ctx, wrLock(ino, 1))
	require.NoError(t, err)
	require.Equal(t, a.Session(), held.GetSession())

	// Byte ranges apart do not conflict.
	r := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_READ, Start: 100, End: 199}
	require.NoError(t, a.SetLock(ctx, client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_UNLOCK, Start: 100, End: client.LockEOF}, false))
	require.NoError(t, b.SetLock(ctx, r, false))

	done := lockAsync(ctx, b, client.Lock{Ino: ino, Owner: 2, Type: pb.LockType_LOCK_WRITE, Start: 0, End: 99})
	select {
	case err := <-done:
		t.Fatalf("the waiter did not wait: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, a.SetLock(ctx, client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_UNLOCK, End: client.LockEOF}, false))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not woken by the unlock")
	}
	held, err = a.GetLock(ctx, wrLock(ino, 1))
	require.NoError(t, err)
	require.Equal(t, b.Session(), held.GetSession())
}

// TestLockWaitInterrupted: a waiter whose context ends is withdrawn with
// EINTR and never granted later.
func TestLockWaitInterrupted(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	a, b := connect(t, cl), connect(t, cl)
	ino := putIno(t, a, "/f", "x")
	require.NoError(t, a.SetLock(t.Context(), wrLock(ino, 1), false))

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := b.SetLock(ctx, wrLock(ino, 1), true)
	require.ErrorIs(t, err, syscall.EINTR)
	require.Equal(t, syscall.EINTR, client.Errno(err))

	require.NoError(t, a.SetLock(t.Context(), client.Lock{Ino: ino, Owner: 1, End: client.LockEOF}, false))
	held, err := a.GetLock(t.Context(), wrLock(ino, 9))
	require.NoError(t, err)
	require.Nil(t, held, "the withdrawn waiter was granted")
}

// TestLockDeadlockAcrossClients: the two-owner cycle is EDEADLK.
func TestLockDeadlockAcrossClients(t *testing.T) {
	cl := servertest.StartCluster(t, 3)
	a, b := connect(t, cl), connect(t, cl)
	ctx := t.Context()
	ino := putIno(t, a, "/f", "x")
	byte0 := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_WRITE, Start: 0, End: 0}
	byte1 := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_WRITE, Start: 1, End: 1}
	require.NoError(t, a.SetLock(ctx, byte0, false))
	require.NoError(t, b.SetLock(ctx, byte1, false))
	// Whichever asks second closes the cycle and is refused; once it
	// lets go of its byte, the other gets the lock it waits for.
	da, db := lockAsync(ctx, a, byte1), lockAsync(ctx, b, byte0)
	var refused *client.Client
	var other <-chan error
	select {
	case err := <-da:
		refused, other = a, db
		require.Equal(t, syscall.EDEADLK, client.Errno(err))
	case err := <-db:
		refused, other = b, da
		require.Equal(t, syscall.EDEADLK, client.Errno(err))
	case <-time.After(30 * time.Second):
		t.Fatal("neither waiter was refused")
	}
	require.NoError(t, refused.SetLock(ctx, client.Lock{Ino: ino, Owner: 1, End: client.LockEOF}, false))
	require.NoError(t, <-other)
}

// TestLockHolderDies: the locks of a client cut off for longer than its
// lease are released when its session expires, and a waiter gets them.
func TestLockHolderDies(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	g := &gate{}
	holder := connect(t, c, client.WithLease(time.Second), client.WithDialer(g.dial),
		client.WithRetryTimeout(time.Second))
	waiter := connect(t, c)
	ino := putIno(t, waiter, "/f", "x")
	ctx := t.Context()
	fl := client.Lock{Ino: ino, Owner: 1, Type: pb.LockType_LOCK_WRITE, Flock: true}
	require.NoError(t, holder.SetLock(ctx, fl, false))
	require.NoError(t, holder.SetLock(ctx, wrLock(ino, 1), false))

	done := lockAsync(ctx, waiter, fl)
	done2 := lockAsync(ctx, waiter, wrLock(ino, 2))
	g.set(true)
	for _, d := range []<-chan error{done, done2} {
		select {
		case err := <-d:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the waiter did not get the lock after the holder's lease")
		}
	}
}

// TestLocksSurviveLeaderKill: locks are replicated state, so a new leader
// knows every lock and waiter: the holder keeps its lock, the waiter
// keeps its place and gets the lock when the holder lets go.
func TestLocksSurviveLeaderKill(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	a, b := connect(t, c), connect(t, c)
	ctx := t.Context()
	ino := putIno(t, a, "/f", "x")
	require.NoError(t, a.SetLock(ctx, wrLock(ino, 1), false))
	done := lockAsync(ctx, b, wrLock(ino, 1))

	c.Kill(c.Index(c.WaitLeader(10 * time.Second)))
	c.WaitLeader(30 * time.Second)
	require.ErrorIs(t, b.SetLock(ctx, wrLock(ino, 2), false), syscall.EAGAIN)
	select {
	case err := <-done:
		t.Fatalf("the waiter got the lock while it was held: %v", err)
	default:
	}
	require.NoError(t, a.SetLock(ctx, client.Lock{Ino: ino, Owner: 1, End: client.LockEOF}, false))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not granted after the failover")
	}
}
