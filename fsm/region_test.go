package fsm_test

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm/block"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func regionOf(t *testing.T, h *capHarness, q *pb.Query) *pb.RegionState {
	t.Helper()
	return h.MustQ(q).Region
}

// TestHandoffMovesCapability: a leecher registers beside the holder's
// exclusive capability without recalling it, the holder keeps writing,
// and one handoff entry ends the holder's tenure and starts the
// leecher's; snapshots keep the registration.
func TestHandoffMovesCapability(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", string(bytes.Repeat([]byte("a"), 2*cs+10))))
	f := ino(t, h.Harness, "/f")

	// Nobody holds it: nothing to leech.
	require.Equal(t, syscall.ENOENT, errnoOf(h.Do(h.as(h.other, ft.Leech(f, false, false)))))
	g := h.Must(h.as(h.holder, ft.GrantExcl(f)))
	require.Equal(t, syscall.ENOENT, errnoOf(h.Do(h.as(h.holder, ft.Leech(f, false, false)))), "its own holder")

	l := h.Must(h.as(h.other, ft.Leech(f, false, false)))
	require.Equal(t, h.holder, l.Session)
	require.Empty(t, h.recalls(), "leeching recalls nothing")
	st := regionOf(t, h, ft.Region(f, 0, 10, 1, 2, 7))
	require.Equal(t, &pb.RegionState{Ino: f, Size: 2*cs + 10, ChunkSize: cs, Holder: h.holder, Epoch: g.Epoch, Leecher: h.other,
		Hashes: st.Hashes, Data: st.Data, Fetched: st.Fetched}, st)
	require.Len(t, st.Hashes, 3)
	sum := block.Sum(bytes.Repeat([]byte("a"), cs))
	require.Equal(t, sum[:], st.Hashes[0])
	require.Equal(t, [][]byte{bytes.Repeat([]byte("a"), cs), bytes.Repeat([]byte("a"), 10), nil}, st.Data)
	require.Equal(t, [][]byte{sum[:], st.Hashes[2], nil}, st.Fetched)

	// A third session cannot leech too; the holder writes on.
	third := h.Must(ft.OpenSession(2000)).Session
	require.Equal(t, syscall.EBUSY, errnoOf(h.Do(h.as(third, ft.Leech(f, false, false)))))
	h.Must(h.as(h.holder, ft.Write("/f", 0, []byte("b"))))
	h.Must(h.as(h.other, ft.Leech(f, true, false)))
	require.True(t, regionOf(t, h, ft.Region(f, 0, 0)).Ready)

	// A long poll waits while nothing it knows changed.
	q := &pb.Query{Q: &pb.Query_Region{Region: &pb.RegionQuery{Ino: f, Wait: true, Holder: h.holder, Epoch: g.Epoch, Leecher: h.other, Ready: true}}}
	require.True(t, h.MustQ(q).Queued)

	// The snapshot keeps the leecher, and restores to the same bytes.
	snap := snapBytes(t, h.F)
	require.Equal(t, snap, snapBytes(t, restored(t, snap)))

	// Handoffs that must not pass: wrong epoch, wrong leecher, not the holder.
	require.Equal(t, syscall.EKEYREVOKED, errnoOf(h.Do(h.as(h.holder, ft.Handoff(f, g.Epoch-1, h.other)))))
	require.Equal(t, syscall.ENOENT, errnoOf(h.Do(h.as(h.holder, ft.Handoff(f, g.Epoch, third)))))
	require.Equal(t, syscall.EKEYREVOKED, errnoOf(h.Do(h.as(h.other, ft.Handoff(f, g.Epoch, h.other)))))

	r := h.Must(h.as(h.holder, ft.Handoff(f, g.Epoch, h.other)))
	require.Equal(t, h.Index, r.Epoch)
	require.Equal(t, []uint64{h.other}, h.F.CapHolders(h.Time)(f))
	require.False(t, h.MustQ(q).Queued, "the holder changed")
	st = regionOf(t, h, ft.Region(f, 0, 0))
	require.Equal(t, h.other, st.Holder)
	require.Equal(t, r.Epoch, st.Epoch)
	require.Zero(t, st.Leecher)

	// The old holder's writes are fenced off; the new one's pass.
	require.Equal(t, syscall.EKEYREVOKED, errnoOf(h.Do(h.as(h.holder, ft.Batch([]*pb.CapRef{ft.Fence(f, g.Epoch)}, ft.Write("/f", 0, []byte("x")))))))
	h.Must(h.as(h.other, ft.Batch([]*pb.CapRef{ft.Fence(f, r.Epoch)}, ft.Write("/f", 0, []byte("c")))))
	// The old holder's write without a fence waits for the new one's
	// capability like anyone's.
	require.True(t, h.Do(h.as(h.holder, ft.Write("/f", 0, []byte("x")))).Recall)
}

// TestLeecherGoesWithItsSession: a leecher whose session ends is
// withdrawn, so the holder's handoff fails and it keeps the capability;
// a holder whose session ends leaves the leecher free to grant.
func TestLeecherGoesWithItsSession(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", "data"))
	f := ino(t, h.Harness, "/f")
	g := h.Must(h.as(h.holder, ft.GrantExcl(f)))
	h.Must(h.as(h.other, ft.Leech(f, true, false)))

	// The leecher's session expires: the holder's keepalives keep its own.
	for range 3 {
		h.Advance(time.Second)
		h.Must(h.as(h.holder, ft.KeepAlive()))
	}
	require.Zero(t, regionOf(t, h, ft.Region(f, 0, 0)).Leecher)
	require.Equal(t, syscall.ENOENT, errnoOf(h.Do(h.as(h.holder, ft.Handoff(f, g.Epoch, h.other)))))
	require.Equal(t, []uint64{h.holder}, h.F.CapHolders(h.Time)(f))

	// A new leecher; now the holder dies, and the leecher's grant passes
	// once its session is gone.
	b := h.Must(ft.OpenSession(10000)).Session
	h.Must(h.as(b, ft.Leech(f, false, false)))
	require.True(t, h.Do(h.as(b, ft.GrantExcl(f))).Recall, "the holder is alive")
	for range 4 {
		h.Advance(time.Second)
		h.Must(h.as(b, ft.KeepAlive()))
	}
	require.Zero(t, regionOf(t, h, ft.Region(f, 0, 0)).Holder)
	g2 := h.Must(h.as(b, ft.GrantExcl(f)))
	require.Equal(t, []uint64{f}, g2.Granted)

	// Withdrawing a registration one does not hold changes nothing.
	c := h.Must(ft.OpenSession(10000)).Session
	h.Must(h.as(c, ft.Leech(f, false, true)))
	require.Zero(t, regionOf(t, h, ft.Region(f, 0, 0)).Leecher)
}

// TestRegionQueryLimits: only regular files, and a bounded hash list.
func TestRegionQueryLimits(t *testing.T) {
	h := newCapHarness(t)
	h.Must(ft.Mkdir("/d", 0o755))
	require.Equal(t, syscall.EINVAL, errnoOf(h.Q(ft.Region(ino(t, h.Harness, "/d"), 0, 1))))
	require.Equal(t, syscall.ENOENT, errnoOf(h.Q(ft.Region(999, 0, 1))))
	h.Must(put("/f", "x"))
	require.Equal(t, syscall.E2BIG, errnoOf(h.Q(ft.Region(ino(t, h.Harness, "/f"), 0, 1<<14+1))))
	require.Len(t, h.MustQ(ft.Region(ino(t, h.Harness, "/f"), 5, 1)).Region.Hashes, 0, "past the end")
}

// TestHandoffCarriesLastWrites: the holder's last writes travel in the
// handoff entry and apply with it, in order, all or none; a handoff that
// fails applies none of them and leaves the capability where it was.
func TestHandoffCarriesLastWrites(t *testing.T) {
	at := func(ino uint64, off int64, data string) *pb.WriteCmd {
		return &pb.WriteCmd{Loc: &pb.Loc{Ino: ino}, Offset: off, Data: []byte(data)}
	}
	tests := []struct {
		name   string
		writes func(f, other uint64) []*pb.WriteCmd
		to     func(h *capHarness) uint64
		errno  syscall.Errno
		want   string
	}{
		{"applied in order", func(f, _ uint64) []*pb.WriteCmd {
			return []*pb.WriteCmd{at(f, 1, "xy"), at(f, 2, "Z"), at(f, int64(cs)+3, "q")}
		}, nil, 0, "axZa"},
		{"not the leecher", func(f, _ uint64) []*pb.WriteCmd { return []*pb.WriteCmd{at(f, 1, "xy")} },
			func(h *capHarness) uint64 { return h.holder + 1000 }, syscall.ENOENT, "aaaa"},
		{"another file", func(f, other uint64) []*pb.WriteCmd {
			return []*pb.WriteCmd{at(f, 1, "xy"), at(other, 0, "z")}
		}, nil, syscall.EINVAL, "aaaa"},
		{"more than data", func(f, _ uint64) []*pb.WriteCmd {
			w := at(f, 1, "xy")
			w.Truncate = true
			return []*pb.WriteCmd{w}
		}, nil, syscall.EINVAL, "aaaa"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newCapHarness(t)
			h.Must(put("/f", string(bytes.Repeat([]byte("a"), 2*cs))))
			h.Must(put("/g", "g"))
			f, other := ino(t, h.Harness, "/f"), ino(t, h.Harness, "/g")
			g := h.Must(h.as(h.holder, ft.GrantExcl(f)))
			h.Must(h.as(h.other, ft.Leech(f, true, false)))
			to := h.other
			if tc.to != nil {
				to = tc.to(h)
			}
			cmd := ft.Handoff(f, g.Epoch, to)
			cmd.GetHandoff().Writes = tc.writes(f, other)
			require.Equal(t, tc.errno, errnoOf(h.Do(h.as(h.holder, cmd))))

			holder := h.holder
			if tc.errno == 0 {
				holder = h.other
			}
			require.Equal(t, []uint64{holder}, h.F.CapHolders(h.Time)(f))
			require.Equal(t, tc.want, string(h.MustQ(ft.Read("/f", 0, 4)).Data))
			require.Equal(t, "g", string(h.MustQ(ft.Read("/g", 0, 4)).Data))
			if tc.errno == 0 {
				require.Equal(t, "aaaq", string(h.MustQ(ft.Read("/f", int64(cs), 4)).Data))
			}
		})
	}
}

// TestHandoffReportsChanged: the chunks a handoff reports changed are
// kept by the new capability (and its snapshot) and answered to a region
// query that asks for them; a list out of order is refused.
func TestHandoffReportsChanged(t *testing.T) {
	h := newCapHarness(t)
	h.Must(put("/f", string(bytes.Repeat([]byte("a"), 8*cs))))
	f := ino(t, h.Harness, "/f")
	g := h.Must(h.as(h.holder, ft.GrantExcl(f)))
	h.Must(h.as(h.other, ft.Leech(f, true, false)))
	withList := func(report bool, changed ...uint64) *pb.Command {
		cmd := ft.Handoff(f, g.Epoch, h.other)
		cmd.GetHandoff().Report, cmd.GetHandoff().Changed = report, changed
		return cmd
	}
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(h.as(h.holder, withList(true, 5, 1)))))
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(h.as(h.holder, withList(true, 1, 1)))))
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(h.as(h.holder, withList(false, 1)))))
	r := h.Must(h.as(h.holder, withList(true, 1, 5, 6)))

	ask := &pb.Query{Q: &pb.Query_Region{Region: &pb.RegionQuery{Ino: f, Changed: true}}}
	st := h.MustQ(ask).Region
	require.Equal(t, r.Epoch, st.Epoch)
	require.True(t, st.Reported)
	require.Equal(t, []uint64{1, 5, 6}, st.Changed)
	st = regionOf(t, h, ft.Region(f, 0, 0))
	require.False(t, st.Reported, "only when asked")
	require.Empty(t, st.Changed)

	snap := snapBytes(t, h.F)
	back := restored(t, snap)
	require.Equal(t, snap, snapBytes(t, back))
	require.Equal(t, []uint64{1, 5, 6}, back.Query(ask).Region.Changed)
}
