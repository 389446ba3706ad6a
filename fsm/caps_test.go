package fsm_test

import (
	"bytes"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// capHarness is a state machine with two sessions, holder and other, and
// the change events of every entry.
type capHarness struct {
	*ft.Harness
	events        []*pb.WatchEvent
	holder, other uint64
	seq           map[uint64]uint64
}

func newCapHarness(t *testing.T) *capHarness {
	h := &capHarness{seq: map[uint64]uint64{}}
	h.Harness = ft.New(t, fsm.Config{ChunkSize: cs, OnChange: func(ev *pb.WatchEvent) { h.events = append(h.events, ev) }})
	h.holder = h.Must(ft.OpenSession(2000)).Session
	h.other = h.Must(ft.OpenSession(2000)).Session
	return h
}

// as stamps c with session s and its next sequence number. It
// acknowledges nothing, since the tests send a waiting command again.
func (h *capHarness) as(s uint64, c *pb.Command) *pb.Command {
	h.seq[s]++
	c.Session, c.Seq = s, h.seq[s]
	return c
}

func (h *capHarness) recalls() []*pb.Recall { return h.events[len(h.events)-1].Recalls }

func TestCapabilityRecall(t *testing.T) {
	h := newCapHarness(t)
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(put("/d/f", "one"))
	d, f := ino(t, h.Harness, "/d"), ino(t, h.Harness, "/d/f")

	g := h.Must(h.as(h.holder, ft.Grant(true, d)))
	require.Equal(t, h.Index, g.Epoch)
	require.Empty(t, g.Refused)
	require.Equal(t, []uint64{d, f}, g.Granted)
	require.Equal(t, []uint64{h.holder}, h.F.CapHolders(h.Time)(f), "with_entries covers the file")

	// The holder's own changes pass.
	h.Must(h.as(h.holder, ft.Write("/d/f", 3, []byte("!"))))

	// Another session's write waits: refused for a recall, not recorded,
	// nothing changed, and the recall is announced once.
	w := h.as(h.other, ft.Write("/d/f", 0, []byte("two")))
	r := h.Do(w)
	require.True(t, r.Recall)
	require.Equal(t, syscall.EAGAIN, errnoOf(r))
	require.Equal(t, []*pb.Recall{{Session: h.holder, Ino: f, Epoch: g.Epoch}}, protoClean(h.recalls()))
	require.Equal(t, "one!", string(h.MustQ(ft.Read("/d/f", 0, 10)).Data))
	require.True(t, h.Do(w).Recall, "the same (session, seq) again: still waiting")
	require.Empty(t, h.recalls(), "recalled once")

	// A create in the directory waits too; a grant on a recalled inode is
	// refused meanwhile.
	require.True(t, h.Do(h.as(h.other, ft.Create("/d/g"))).Recall)
	require.Equal(t, []uint64{f}, h.Must(h.as(h.other, ft.Grant(false, f))).Refused)

	// A release naming another epoch releases nothing.
	require.Zero(t, h.Must(h.as(h.holder, ft.Release(f, g.Epoch+1))).N)
	require.True(t, h.Do(w).Recall)
	require.EqualValues(t, 1, h.Must(h.as(h.holder, ft.Release(f, g.Epoch))).N)
	r = h.Do(w)
	require.Zero(t, r.Errno, r.Message)
	require.Equal(t, "two!", string(h.MustQ(ft.Read("/d/f", 0, 10)).Data))
	// Recorded now: a retry returns the result without writing again.
	require.Equal(t, r.N, h.Do(w).N)
}

func TestCapabilityRevokedAfterLease(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "x"))
	f := ino(t, h.Harness, "/f")
	g := h.Must(h.as(h.holder, ft.Grant(false, f)))
	h.Must(h.as(h.other, ft.KeepAlive()))
	w := h.as(h.other, ft.Chmod("/f", 0o600))
	require.True(t, h.Do(w).Recall)

	// The holder keeps its session alive but never releases: the cluster
	// takes the capability when the holder's lease has passed since the
	// recall, and the waiting command goes through.
	h.Advance(1500 * time.Millisecond)
	h.Must(h.as(h.holder, ft.KeepAlive()))
	h.Must(h.as(h.other, ft.KeepAlive()))
	require.True(t, h.Do(w).Recall)
	h.Advance(600 * time.Millisecond)
	h.Must(h.as(h.holder, ft.KeepAlive()))
	require.Equal(t, []*pb.Recall{{Session: h.holder, Ino: f, Epoch: g.Epoch, Revoked: true}}, protoClean(h.recalls()))
	require.Zero(t, h.Do(w).Errno)
	// Fenced: the late release of the revoked capability changes nothing.
	require.Zero(t, h.Must(h.as(h.holder, ft.Release(f, g.Epoch))).N)
}

func TestCapabilitiesEndWithTheirSession(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "x"))
	f := ino(t, h.Harness, "/f")
	h.Must(h.as(h.holder, ft.Grant(false, f, 1)))
	require.EqualValues(t, 2, h.F.CapCount())
	h.Must(h.as(h.holder, ft.CloseSession()))
	require.Zero(t, h.F.CapCount())
	require.Zero(t, h.Do(h.as(h.other, ft.Unlink("/f"))).Errno)
}

func TestCapabilityOfUnlinkedInodeGoes(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "x"))
	f := ino(t, h.Harness, "/f")
	h.Must(h.as(h.holder, ft.Grant(false, f)))
	h.Must(h.as(h.holder, ft.Unlink("/f")))
	require.Zero(t, h.F.CapCount())
	require.Equal(t, []uint64{f}, h.Must(h.as(h.holder, ft.Grant(false, f))).Refused)
}

// TestCapabilitiesInSnapshots checks that capabilities, recalled ones
// included, survive a snapshot and restore.
func TestCapabilitiesInSnapshots(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "x"))
	f := ino(t, h.Harness, "/f")
	h.Must(h.as(h.holder, ft.Grant(true, 1)))
	require.True(t, h.Do(h.as(h.other, ft.Unlink("/f"))).Recall)
	var buf bytes.Buffer
	_, err := h.F.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, g.Restore(bytes.NewReader(buf.Bytes())))
	require.Equal(t, h.F.CapCount(), g.CapCount())
	require.Equal(t, h.F.CapHolders(h.Time)(f), g.CapHolders(h.Time)(f))
	var again bytes.Buffer
	_, err = g.Snapshot().WriteTo(&again)
	require.NoError(t, err)
	require.Equal(t, buf.Bytes(), again.Bytes())
}

// TestGuardCoversChanges applies random logs, one command per entry, and
// checks the promise capabilities make: no command changes an inode (its
// attributes, data or entries) on which another session held a
// capability in force when the command began.
func TestGuardCoversChanges(t *testing.T) {
	for seed := range uint64(8) {
		g := newLogGen(100 + seed)
		var ev *pb.WatchEvent
		f, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit, OnChange: func(e *pb.WatchEvent) { ev = e }})
		require.NoError(t, err)
		index, grants, checked := uint64(0), 0, 0
		for range 1500 {
			e := g.entry()
			var res []*pb.Result
			for _, c := range e.Commands {
				holders := f.CapHolders(e.TimeNs)
				index++
				r := f.Apply(index, ft.Entry(e.TimeNs, c))[0]
				res = append(res, r)
				if _, ok := c.Op.(*pb.Command_Grant); ok && r.Errno == 0 && len(r.Refused) == 0 {
					grants++
				}
				touched := slices.Clone(ev.Inodes)
				for _, d := range ev.Entries {
					touched = append(touched, d.Ino)
				}
				for _, ino := range touched {
					for _, s := range holders(ino) {
						require.Equal(t, c.Session, s, "seed %d index %d: %v changed inode %d under a capability of session %d", seed, index, c, ino, s)
					}
				}
				checked++
			}
			g.observe(e, res)
		}
		require.Positive(t, grants, "seed %d: no grant succeeded", seed)
	}
}

// put creates the file at p holding data.
func put(p, data string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path(p), Data: []byte(data), Create: true, Truncate: true, Mode: 0o644}}}
}

// protoClean drops protobuf's internal state so that messages compare
// with require.Equal.
func protoClean(rs []*pb.Recall) []*pb.Recall {
	out := make([]*pb.Recall, len(rs))
	for i, r := range rs {
		out[i] = &pb.Recall{Session: r.Session, Ino: r.Ino, Epoch: r.Epoch, Revoked: r.Revoked}
	}
	return out
}

// TestExclusiveCapability: an exclusive capability keeps every other
// session's off the inode. Either grant that conflicts recalls the other
// and waits like a change; the holder's own grants keep it exclusive; a
// create in a directory held exclusively hands out an exclusive one; the
// flag survives a snapshot.
func TestExclusiveCapability(t *testing.T) {
	h := newCapHarness(t)
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(put("/d/f", "one"))
	d, f := ino(t, h.Harness, "/d"), ino(t, h.Harness, "/d/f")

	// Shared by other, then exclusive by holder: other's is recalled and
	// the exclusive grant waits for it.
	so := h.Must(h.as(h.other, ft.Grant(false, f)))
	x := h.as(h.holder, ft.GrantExcl(f))
	r := h.Do(x)
	require.True(t, r.Recall)
	require.Equal(t, []*pb.Recall{{Session: h.other, Ino: f, Epoch: so.Epoch}}, protoClean(h.recalls()))
	h.Must(h.as(h.other, ft.Release(f, so.Epoch)))
	r = h.Do(x)
	require.Zero(t, r.Errno, r.Message)
	require.Equal(t, []uint64{f}, r.Granted)

	// Now a shared grant of other waits for the exclusive one.
	s := h.as(h.other, ft.Grant(false, f))
	require.True(t, h.Do(s).Recall)
	require.Equal(t, []*pb.Recall{{Session: h.holder, Ino: f, Epoch: r.Epoch}}, protoClean(h.recalls()))
	require.Equal(t, []uint64{h.holder}, h.F.CapHolders(h.Time)(f))
	h.Must(h.as(h.holder, ft.Release(f, r.Epoch)))
	require.Equal(t, []uint64{f}, h.Must(s).Granted)

	// The holder's own grants: shared then exclusive is an upgrade once
	// other's shared one is gone; granted shared again it stays exclusive.
	o2 := h.Must(h.as(h.other, ft.Grant(false, d)))
	dx := h.as(h.holder, ft.GrantExcl(d))
	require.True(t, h.Do(dx).Recall)
	h.Must(h.as(h.other, ft.Release(d, o2.Epoch)))
	require.Equal(t, []uint64{d}, h.Must(dx).Granted)
	h.Must(h.as(h.holder, ft.Grant(false, d)))
	require.True(t, h.Do(h.as(h.other, ft.Grant(false, d))).Recall, "still exclusive")

	// A file the holder creates in the directory is its exclusively.
	c := h.Must(h.as(h.holder, ft.Create("/d/g")))
	require.NotZero(t, c.Epoch)
	g := ino(t, h.Harness, "/d/g")
	require.True(t, h.Do(h.as(h.other, ft.Grant(false, g))).Recall)

	// Snapshot and restore keep it exclusive.
	var buf bytes.Buffer
	_, err := h.F.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	res, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, res.Restore(bytes.NewReader(buf.Bytes())))
	var again bytes.Buffer
	_, err = res.Snapshot().WriteTo(&again)
	require.NoError(t, err)
	require.Equal(t, buf.Bytes(), again.Bytes())
}

// TestQueuedTruncateKeepsCapabilitiesOff: an exclusive open queued with
// O_TRUNC truncates when the holder's open ends, in a command of the
// holder or at its session's expiry, where nothing can wait for a
// recall. So it waits for every capability on the file to go before it
// queues, and while it waits none is granted.
func TestQueuedTruncateKeepsCapabilitiesOff(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "data"))
	f := ino(t, h.Harness, "/f")
	g := h.Must(h.as(h.holder, ft.Grant(false, f)))
	h.Must(h.as(h.holder, ft.OpenExcl("/f", ft.ORdonly, false)))

	q := h.as(h.other, ft.OpenExcl("/f", ft.ORdwr|ft.OTrunc, true))
	require.True(t, h.Do(q).Recall, "the holder's capability goes first")
	h.Must(h.as(h.holder, ft.Release(f, g.Epoch)))
	r := h.Must(q)
	require.True(t, r.Queued)
	require.Equal(t, []uint64{f}, h.Must(h.as(h.holder, ft.Grant(false, f))).Refused)
	require.Equal(t, []uint64{f}, h.Must(h.as(h.other, ft.Grant(false, f))).Refused)

	h.Must(h.as(h.holder, ft.CloseSession()))
	require.Zero(t, h.MustQ(ft.Stat("/f")).Attr.Size, "granted, and truncated")
	require.Equal(t, []uint64{f}, h.Must(h.as(h.other, ft.Grant(false, f))).Granted)
}
