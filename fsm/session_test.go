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

// inSession stamps c with session s and sequence seq.
func inSession(s, seq uint64, c *pb.Command) *pb.Command {
	c.Session, c.Seq = s, seq
	return c
}

func TestLeaseExpiry(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	s := h.Must(ft.OpenSession(1000)).Session
	require.Equal(t, int64(1000), h.Must(inSession(s, 0, ft.KeepAlive())).LeaseMs)
	require.Equal(t, uint64(1), h.F.Stats().Sessions)

	// Renewed by keep_alive and by any command.
	h.Advance(800 * time.Millisecond)
	h.Must(inSession(s, 0, ft.KeepAlive()))
	h.Advance(800 * time.Millisecond)
	h.Must(inSession(s, 0, ft.Mkdir("/d", 0o755)))
	h.Advance(800 * time.Millisecond)
	h.Must(ft.Tick())
	require.Equal(t, uint64(1), h.F.Stats().Sessions)

	// Expires by log time, even with only ticks.
	h.Advance(2 * time.Second)
	h.Must(ft.Tick())
	require.Zero(t, h.F.Stats().Sessions)
	before := dump(t, h.F)
	r := h.Do(inSession(s, 1, ft.Mkdir("/e", 0o755)))
	require.Equal(t, syscall.ESTALE, errnoOf(r))
	require.Equal(t, before, dump(t, h.F))

	// Log time never runs backwards: an entry stamped earlier does not
	// bring the session back or move times back.
	s2 := h.Must(ft.OpenSession(1000)).Session
	h.Time -= int64(time.Hour)
	h.Must(inSession(s2, 0, ft.Mkdir("/e", 0o755)))
	require.GreaterOrEqual(t, h.MustQ(ft.Stat("/e")).Attr.MtimeNs, h.MustQ(ft.Stat("/d")).Attr.MtimeNs)
}

func TestExclusiveOpenFIFO(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(ft.Mkdir("/d", 0o755))
	a := h.Must(ft.OpenSession(10_000)).Session
	b := h.Must(ft.OpenSession(1_000)).Session
	c := h.Must(ft.OpenSession(10_000)).Session
	excl := func(s uint64, wait bool, flags uint32) *pb.Result {
		return h.Do(inSession(s, 0, ft.OpenExcl("/d/f", flags, wait)))
	}
	ha := excl(a, false, ft.OCreat|ft.ORdwr)
	require.Zero(t, ha.Errno, ha.Message)
	h.Must(inSession(a, 0, ft.WriteH(ha.Handle, 0, []byte("held"))))

	require.Equal(t, syscall.EWOULDBLOCK, errnoOf(excl(b, false, ft.ORdwr)))
	hb := excl(b, true, ft.ORdwr|ft.OTrunc)
	require.Zero(t, hb.Errno)
	require.True(t, hb.Queued)
	hc := excl(c, true, ft.ORdwr)
	require.True(t, hc.Queued)
	require.True(t, h.MustQ(ft.HandleStatus(b, hb.Handle)).Queued)
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Do(inSession(b, 0, ft.WriteH(hb.Handle, 0, []byte("x"))))))
	require.Equal(t, syscall.EAGAIN, errnoOf(h.Q(ft.ReadH(hb.Handle, 0, 1))))
	require.Equal(t, []byte("held"), h.MustQ(ft.Read("/d/f", 0, 10)).Data, "O_TRUNC waits for the grant")

	// A plain open is not blocked by an exclusive holder.
	plain := h.Must(inSession(c, 0, ft.Open("/d/f", ft.ORdonly, 0)))
	require.False(t, plain.Queued)

	// The holder closes: the first waiter gets the file, and its O_TRUNC
	// applies now.
	h.Must(inSession(a, 0, ft.Close(ha.Handle)))
	st := h.MustQ(ft.HandleStatus(b, hb.Handle))
	require.False(t, st.Queued)
	require.Zero(t, st.Errno)
	require.Zero(t, h.MustQ(ft.Stat("/d/f")).Attr.Size)
	require.True(t, h.MustQ(ft.HandleStatus(c, hc.Handle)).Queued)
	h.Must(inSession(b, 0, ft.WriteH(hb.Handle, 0, []byte("b was here"))))

	// b's lease runs out: its handle closes and c is next.
	h.Advance(1500 * time.Millisecond)
	h.Must(inSession(c, 0, ft.KeepAlive()))
	require.Equal(t, syscall.EBADF, errnoOf(h.Q(ft.HandleStatus(b, hb.Handle))))
	require.False(t, h.MustQ(ft.HandleStatus(c, hc.Handle)).Queued)
	require.Equal(t, []byte("b was here"), h.MustQ(ft.ReadH(hc.Handle, 0, 100)).Data)

	// Closing the session releases everything; a new exclusive open works.
	h.Must(inSession(c, 0, ft.CloseSession()))
	require.Zero(t, excl(a, false, ft.ORdwr).Errno)
}

func TestQueuedCloseLeavesLine(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	s := h.OpenSession(10_000)
	r1 := h.Must(inSession(s, 0, ft.OpenExcl("/f", ft.OCreat|ft.ORdwr, false)))
	r2 := h.Must(inSession(s, 0, ft.OpenExcl("/f", ft.ORdwr, true)))
	r3 := h.Must(inSession(s, 0, ft.OpenExcl("/f", ft.ORdwr, true)))
	require.True(t, r2.Queued)
	h.Must(inSession(s, 0, ft.Close(r2.Handle))) // leaves the line
	h.Must(inSession(s, 0, ft.Close(r1.Handle)))
	require.False(t, h.MustQ(ft.HandleStatus(s, r3.Handle)).Queued)
	h.Must(inSession(s, 0, ft.Close(r3.Handle)))
	require.Zero(t, h.Do(inSession(s, 0, ft.OpenExcl("/f", ft.ORdwr, false))).Errno)
}

func TestUnlinkWhileOpen(t *testing.T) {
	for _, end := range []string{"close", "expiry"} {
		t.Run(end, func(t *testing.T) {
			h := ft.New(t, fsm.Config{ChunkSize: cs})
			s := h.OpenSession(1000)
			r := h.Must(inSession(s, 0, ft.Create("/f")))
			h.Must(inSession(s, 0, ft.WriteH(r.Handle, 0, []byte("still here"))))
			h.Must(ft.Remove("/f"))
			require.Equal(t, syscall.ENOENT, errnoOf(h.Q(ft.Stat("/f"))))
			require.Equal(t, []byte("still here"), h.MustQ(ft.ReadH(r.Handle, 0, 100)).Data)
			w := h.Must(inSession(s, 0, ft.WriteH(r.Handle, 10, []byte("!"))))
			require.Zero(t, w.Attr.Nlink)
			require.Equal(t, uint64(2), h.F.Stats().Inodes)
			require.NotZero(t, h.F.Stats().Block.PhysicalBytes)
			// The name can be reused meanwhile.
			r2 := h.Must(inSession(s, 0, ft.Create("/f")))
			h.Must(inSession(s, 0, ft.Close(r2.Handle)))
			if end == "close" {
				h.Must(inSession(s, 0, ft.Close(r.Handle)))
			} else {
				h.Advance(2 * time.Second)
				h.Must(ft.Tick())
			}
			require.Equal(t, uint64(2), h.F.Stats().Inodes)
			require.Zero(t, h.F.Stats().Block.PhysicalBytes)
			require.Zero(t, h.F.Stats().LogicalBytes)
		})
	}
}

func TestDuplicateRequests(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	s := h.OpenSession(60_000)
	open := h.Must(inSession(s, 1, ft.Create("/f")))
	app := func(seq, ack uint64) *pb.Command {
		c := inSession(s, seq, &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Handle: open.Handle, Data: []byte("ab"), Append: true}}})
		c.Ack = ack
		return c
	}
	first := h.Must(app(2, 0))
	again := h.Must(app(2, 0))
	require.Equal(t, first.Attr, again.Attr, "a retry returns the recorded result")
	require.Equal(t, uint64(2), h.MustQ(ft.Stat("/f")).Attr.Size, "and does not apply twice")
	// A retried open does not open a second handle.
	require.Equal(t, open.Handle, h.Must(inSession(s, 1, ft.Create("/f"))).Handle)

	// Failures are recorded too.
	m1 := h.Do(inSession(s, 3, ft.Mkdir("/f", 0o755)))
	require.Equal(t, syscall.EEXIST, errnoOf(m1))
	h.Must(ft.Remove("/f"))
	require.Equal(t, syscall.EEXIST, errnoOf(h.Do(inSession(s, 3, ft.Mkdir("/f", 0o755)))))

	// The table survives a snapshot.
	var buf bytes.Buffer
	_, err := h.F.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	g, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	require.NoError(t, g.Restore(&buf))
	res := g.Apply(h.Index+1, ft.Entry(h.Time, app(2, 0)))
	require.Equal(t, first.Attr, res[0].Attr)

	// ack drops records below it, and a late copy of an answered command
	// (seq below the highest ack) is refused, never applied again.
	h.Must(app(4, 3))
	r := h.Do(app(2, 0))
	require.Equal(t, syscall.EALREADY, errnoOf(r))
	st := h.MustQ(ft.StatLoc(ft.Ino(open.Attr.Ino)))
	require.Equal(t, uint64(4), st.Attr.Size, "the late copy changed nothing")
}

func TestSessionlessCommands(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(ft.Mkdir("/d", 0o755))
	require.Equal(t, syscall.EEXIST, errnoOf(h.Do(ft.Mkdir("/d", 0o755))), "no duplicate protection without a session")
	// Session ids are never reused.
	a := h.Must(ft.OpenSession(0))
	require.Equal(t, int64(15_000), a.LeaseMs)
	h.Must(inSession(a.Session, 0, ft.CloseSession()))
	require.Equal(t, syscall.ESTALE, errnoOf(h.Do(inSession(a.Session, 0, ft.CloseSession()))))
	require.Greater(t, h.Must(ft.OpenSession(0)).Session, a.Session)
}

// TestRenewFirstKeepsQueuedSession: an entry that formed after a session's
// lease ran out still renews the session when it carries a command of it
// and renew_first is set (the command reached the leader in time; the log
// was stalled). Without the flag, as in entries of older leaders, the
// lease runs out first. An entry carrying nothing of the session ends it.
func TestRenewFirstKeepsQueuedSession(t *testing.T) {
	for _, c := range []struct {
		name       string
		renewFirst bool
		carries    bool
		alive      bool
	}{
		{"renew first", true, true, true},
		{"expire first", false, true, false},
		{"nothing of the session", true, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := ft.New(t, fsm.Config{ChunkSize: cs})
			s := h.Must(ft.OpenSession(1000)).Session
			h.Advance(5 * time.Second) // a stalled log: the lease ran out meanwhile
			cmds := []*pb.Command{ft.Tick()}
			if c.carries {
				cmds = append(cmds, inSession(s, 0, ft.KeepAlive()))
			}
			e := ft.Entry(h.Time, cmds...)
			e.RenewFirst = c.renewFirst
			h.Index++
			res := h.F.Apply(h.Index, e)
			if !c.alive {
				require.Zero(t, h.F.Stats().Sessions)
				if c.carries {
					require.Equal(t, syscall.ESTALE, errnoOf(res[1]))
				}
				return
			}
			require.Zero(t, res[1].Errno)
			h.Advance(900 * time.Millisecond) // renewed at the entry's time
			h.Must(ft.Tick())
			require.Equal(t, uint64(1), h.F.Stats().Sessions)
			h.Advance(200 * time.Millisecond)
			h.Must(ft.Tick())
			require.Zero(t, h.F.Stats().Sessions)
		})
	}
}

// TestRenewAllAfterLeaderless: a new leader's entries marked renew_all
// renew every session at their time, so the time without a leader counts
// against no lease; the next lease is counted from that entry.
func TestRenewAllAfterLeaderless(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	a := h.Must(ft.OpenSession(1000)).Session
	b := h.Must(ft.OpenSession(3000)).Session
	h.Advance(10 * time.Second) // no leader meanwhile
	e := ft.Entry(h.Time, ft.Tick())
	e.RenewAll = true
	h.Index++
	h.F.Apply(h.Index, e)
	require.Equal(t, uint64(2), h.F.Stats().Sessions)
	h.Advance(1500 * time.Millisecond)
	h.Must(ft.Tick())
	require.Equal(t, uint64(1), h.F.Stats().Sessions, "a's lease ran out a lease after the renewal")
	require.Zero(t, h.Do(inSession(b, 0, ft.KeepAlive())).Errno)
	require.Equal(t, syscall.ESTALE, errnoOf(h.Do(inSession(a, 0, ft.KeepAlive()))))
}
