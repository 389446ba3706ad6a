package fsm_test

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

const (
	rd    = pb.LockType_LOCK_READ
	wr    = pb.LockType_LOCK_WRITE
	unlck = pb.LockType_LOCK_UNLOCK
	toEOF = 1<<64 - 1
)

// lockFixture is a file and two sessions, a and b.
func lockFixture(t *testing.T) (h *ft.Harness, ino, a, b uint64) {
	h = ft.New(t, fsm.Config{ChunkSize: cs})
	w := ft.Write("/f", 0, []byte("x"))
	w.GetWrite().Create = true
	ino = h.Must(w).Attr.Ino
	a = h.Must(ft.OpenSession(10_000)).Session
	b = h.Must(ft.OpenSession(10_000)).Session
	return h, ino, a, b
}

func TestLockConflicts(t *testing.T) {
	type lk struct {
		sess  int // 0: session a, 1: session b
		owner uint64
		typ   pb.LockType
		start uint64
		end   uint64
		flock bool
	}
	cases := []struct {
		name string
		held lk
		ask  lk
		want syscall.Errno
	}{
		{"two readers", lk{0, 1, rd, 0, 9, false}, lk{1, 1, rd, 5, 20, false}, 0},
		{"reader against writer", lk{0, 1, wr, 0, 9, false}, lk{1, 1, rd, 9, 9, false}, syscall.EAGAIN},
		{"writer against reader", lk{0, 1, rd, 0, 9, false}, lk{1, 1, wr, 0, 0, false}, syscall.EAGAIN},
		{"ranges apart", lk{0, 1, wr, 0, 9, false}, lk{1, 1, wr, 10, 19, false}, 0},
		{"to the end of file", lk{0, 1, wr, 100, toEOF, false}, lk{1, 1, rd, 1 << 40, 1 << 40, false}, syscall.EAGAIN},
		{"same owner replaces", lk{0, 1, rd, 0, 9, false}, lk{0, 1, wr, 0, 9, false}, 0},
		{"other owner of the same session", lk{0, 1, wr, 0, 9, false}, lk{0, 2, rd, 0, 9, false}, syscall.EAGAIN},
		{"same owner number, other session", lk{0, 1, wr, 0, 9, false}, lk{1, 1, wr, 0, 9, false}, syscall.EAGAIN},
		{"flock against flock", lk{0, 1, wr, 0, 0, true}, lk{1, 1, rd, 0, 0, true}, syscall.EAGAIN},
		{"shared flocks", lk{0, 1, rd, 0, 0, true}, lk{1, 1, rd, 0, 0, true}, 0},
		{"flock and POSIX ignore each other", lk{0, 1, wr, 0, 0, true}, lk{1, 1, wr, 0, toEOF, false}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, ino, a, b := lockFixture(t)
			sess := []uint64{a, b}
			cmd := func(l lk) *pb.Command {
				x := ft.Lock(ino, l.owner, l.typ, l.start, l.end, false)
				if l.flock {
					x = ft.Flock(ino, l.owner, l.typ, false)
				}
				return inSession(sess[l.sess], 0, x)
			}
			h.Must(cmd(c.held))
			require.Equal(t, c.want, errnoOf(h.Do(cmd(c.ask))))
			// F_GETLK agrees, and names the lock in the way.
			q := ft.GetLk(ino, sess[c.ask.sess], c.ask.owner, c.ask.typ, c.ask.start, c.ask.end)
			q.GetLock().Flock = c.ask.flock
			r := h.MustQ(q)
			if c.want == 0 {
				require.Nil(t, r.Lock)
			} else {
				require.Equal(t, sess[c.held.sess], r.Lock.Session)
				require.Equal(t, c.held.typ, r.Lock.Type)
			}
		})
	}
}

func TestLockSplitAndMerge(t *testing.T) {
	h, ino, a, b := lockFixture(t)
	h.Must(inSession(a, 0, ft.Lock(ino, 1, wr, 0, 99, false)))
	h.Must(inSession(a, 0, ft.Lock(ino, 1, unlck, 10, 19, false)))
	// The hole is free, both sides stay held.
	h.Must(inSession(b, 0, ft.Lock(ino, 1, wr, 10, 19, false)))
	for _, r := range [][2]uint64{{9, 9}, {20, 20}, {99, 99}} {
		got := h.MustQ(ft.GetLk(ino, b, 1, rd, r[0], r[1])).Lock
		require.NotNil(t, got, "byte %d", r[0])
		require.Equal(t, a, got.Session)
	}
	require.Equal(t, &pb.Lock{Type: wr, Start: 20, End: 99, Pid: 1, Session: a, Owner: 1},
		h.MustQ(ft.GetLk(ino, b, 1, rd, 50, 50)).Lock)
	h.Must(inSession(b, 0, ft.Lock(ino, 1, unlck, 0, toEOF, false)))

	// A downgrade of the middle leaves three pieces; re-locking the whole
	// merges them back into one.
	h.Must(inSession(a, 0, ft.Lock(ino, 1, rd, 40, 59, false)))
	h.Must(inSession(b, 0, ft.Lock(ino, 1, rd, 45, 50, false)))
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Do(inSession(b, 0, ft.Lock(ino, 1, rd, 60, 60, false)))))
	h.Must(inSession(b, 0, ft.Lock(ino, 1, unlck, 0, toEOF, false)))
	h.Must(inSession(a, 0, ft.Lock(ino, 1, wr, 0, 99, false)))
	require.Equal(t, &pb.Lock{Type: wr, Start: 0, End: 99, Pid: 1, Session: a, Owner: 1},
		h.MustQ(ft.GetLk(ino, b, 1, rd, 0, toEOF)).Lock)
	requireRestores(t, h.F)
}

func TestLockWaitersInOrder(t *testing.T) {
	h, ino, a, b := lockFixture(t)
	c := h.Must(ft.OpenSession(10_000)).Session
	h.Must(inSession(a, 0, ft.Lock(ino, 1, wr, 0, 9, false)))
	rb := h.Must(inSession(b, 0, ft.Lock(ino, 1, wr, 0, 9, true)))
	rc := h.Must(inSession(c, 0, ft.Lock(ino, 1, wr, 5, 5, true)))
	require.True(t, rb.Queued)
	require.True(t, rc.Queued)
	require.NotEqual(t, rb.Waiter, rc.Waiter)
	require.True(t, h.MustQ(ft.Waiting(ino, b, rb.Waiter)).Queued)
	requireRestores(t, h.F)

	// The first in line gets it; the second still waits, now for b.
	h.Must(inSession(a, 0, ft.Lock(ino, 1, unlck, 0, toEOF, false)))
	require.False(t, h.MustQ(ft.Waiting(ino, b, rb.Waiter)).Queued)
	require.True(t, h.MustQ(ft.Waiting(ino, c, rc.Waiter)).Queued)
	require.Equal(t, b, h.MustQ(ft.GetLk(ino, a, 1, rd, 0, 0)).Lock.Session)

	// A waiter cancelled while waiting is dropped and never granted; a
	// cancel after the grant changes nothing.
	require.True(t, h.Must(inSession(c, 0, ft.CancelLock(ino, rc.Waiter))).Queued)
	require.False(t, h.Must(inSession(b, 0, ft.CancelLock(ino, rb.Waiter))).Queued)
	h.Must(inSession(b, 0, ft.Lock(ino, 1, unlck, 0, toEOF, false)))
	require.Nil(t, h.MustQ(ft.GetLk(ino, a, 1, wr, 0, toEOF)).Lock)
	requireRestores(t, h.F)
}

func TestLockDeadlock(t *testing.T) {
	h, ino, a, b := lockFixture(t)
	h.Must(inSession(a, 0, ft.Lock(ino, 1, wr, 0, 0, false)))
	h.Must(inSession(b, 0, ft.Lock(ino, 1, wr, 1, 1, false)))
	require.True(t, h.Must(inSession(a, 0, ft.Lock(ino, 1, wr, 1, 1, true))).Queued)
	require.Equal(t, syscall.EDEADLK, errnoOf(h.Do(inSession(b, 0, ft.Lock(ino, 1, wr, 0, 0, true)))))
	// Without waiting there is no cycle to report.
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Do(inSession(b, 0, ft.Lock(ino, 1, wr, 0, 0, false)))))
	// flock waits are not checked, as on Linux.
	h.Must(inSession(a, 0, ft.Flock(ino, 1, wr, false)))
	require.True(t, h.Must(inSession(b, 0, ft.Flock(ino, 1, wr, true))).Queued)
}

func TestLocksEndWithSession(t *testing.T) {
	h, ino, a, b := lockFixture(t)
	short := h.Must(ft.OpenSession(1000)).Session
	h.Must(inSession(short, 0, ft.Flock(ino, 7, wr, false)))
	h.Must(inSession(short, 0, ft.Lock(ino, 7, wr, 0, toEOF, false)))
	// A waiter that leaves with its session is never reported granted.
	rs := h.Must(inSession(short, 0, ft.Lock(ino, 8, rd, 0, 0, true)))
	require.True(t, rs.Queued)
	rf := h.Must(inSession(a, 0, ft.Flock(ino, 1, rd, true)))
	rp := h.Must(inSession(b, 0, ft.Lock(ino, 1, rd, 0, 0, true)))
	require.True(t, rf.Queued)
	require.True(t, rp.Queued)
	for range 5 {
		h.Advance(time.Second)
		h.Must(inSession(a, 0, ft.KeepAlive()))
		h.Must(inSession(b, 0, ft.KeepAlive()))
	}
	require.False(t, h.MustQ(ft.Waiting(ino, a, rf.Waiter)).Queued)
	require.False(t, h.MustQ(ft.Waiting(ino, b, rp.Waiter)).Queued)
	require.Equal(t, syscall.ESTALE, errnoOf(h.Q(ft.Waiting(ino, short, rs.Waiter))))
	q := ft.GetLk(ino, short, 7, wr, 0, 0)
	q.GetLock().Flock = true
	require.Equal(t, a, h.MustQ(q).Lock.Session)
	requireRestores(t, h.F)

	// Locks also go with their inode.
	h.Must(ft.Remove("/f"))
	require.Equal(t, syscall.ENOENT, errnoOf(h.Q(ft.GetLk(ino, a, 1, rd, 0, 0))))
	requireRestores(t, h.F)
}

func TestFlockConversion(t *testing.T) {
	h, ino, a, b := lockFixture(t)
	h.Must(inSession(a, 0, ft.Flock(ino, 1, rd, false)))
	h.Must(inSession(b, 0, ft.Flock(ino, 1, rd, false)))
	// A failed upgrade keeps the shared lock (nothing changes on an
	// error), so b cannot upgrade either.
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Do(inSession(a, 0, ft.Flock(ino, 1, wr, false)))))
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Do(inSession(b, 0, ft.Flock(ino, 1, wr, false)))))
	// A waiting upgrade gives the shared lock up first, so b's upgrade
	// goes through and a's follows once b unlocks.
	ra := h.Must(inSession(a, 0, ft.Flock(ino, 1, wr, true)))
	require.True(t, ra.Queued)
	h.Must(inSession(b, 0, ft.Flock(ino, 1, wr, false)))
	h.Must(inSession(b, 0, ft.Flock(ino, 1, unlck, false)))
	require.False(t, h.MustQ(ft.Waiting(ino, a, ra.Waiter)).Queued)
	q := ft.GetLk(ino, b, 1, rd, 0, 0)
	q.GetLock().Flock = true
	require.Equal(t, a, h.MustQ(q).Lock.Session)
}

func TestLockBadRequests(t *testing.T) {
	h, ino, a, _ := lockFixture(t)
	for _, c := range []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"no session", ft.Lock(ino, 1, wr, 0, 0, false), syscall.ESTALE},
		{"missing inode", inSession(a, 0, ft.Lock(999, 1, wr, 0, 0, false)), syscall.ENOENT},
		{"range backwards", inSession(a, 0, ft.Lock(ino, 1, wr, 5, 4, false)), syscall.EINVAL},
		{"unknown type", inSession(a, 0, ft.Lock(ino, 1, 7, 0, 0, false)), syscall.EINVAL},
	} {
		require.Equal(t, c.want, errnoOf(h.Do(c.cmd)), c.name)
	}
	// Alternate owners' locks apart from each other fill the record.
	var last syscall.Errno
	for i := range uint64(4100) {
		last = errnoOf(h.Do(inSession(a, 0, ft.Lock(ino, 10+i, rd, 2*i, 2*i, false))))
	}
	require.Equal(t, syscall.ENOLCK, last)
	requireRestores(t, h.F)
}

// requireRestores checks that a snapshot of f restores (its invariants
// hold) and writes back the same bytes.
func requireRestores(t *testing.T, f *fsm.FSM) {
	t.Helper()
	snap := snapBytes(t, f)
	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, g.Restore(bytes.NewReader(snap)))
	require.Equal(t, snap, snapBytes(t, g))
}
