package fsm_test

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// batchFixture is a capHarness whose holder holds /d exclusively and a
// reservation of ten inode numbers, with files /d/a (two chunks) and /d/b
// (three chunks of other bytes).
type batchFixture struct {
	*capHarness
	d, a, b      uint64
	dEpoch       uint64
	first, epoch uint64 // the holder's reservation
}

func newBatchFixture(t *testing.T) *batchFixture {
	f := &batchFixture{capHarness: newCapHarness(t)}
	h := f.capHarness
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(put("/d/a", string(chunks(2, 1))))
	h.Must(put("/d/b", string(chunks(3, 11))))
	f.d, f.a, f.b = ino(t, h.Harness, "/d"), ino(t, h.Harness, "/d/a"), ino(t, h.Harness, "/d/b")
	f.dEpoch = h.Must(h.as(h.holder, ft.GrantExcl(f.d))).Epoch
	r := h.Must(h.as(h.holder, ft.ReserveInodes(10)))
	f.first, f.epoch = r.FirstIno, r.Epoch
	return f
}

func (f *batchFixture) fence() []*pb.CapRef { return []*pb.CapRef{ft.Fence(f.d, f.dEpoch)} }

func TestBatchApplies(t *testing.T) {
	f := newBatchFixture(t)
	h := f.capHarness
	stamp := h.Time - int64(5*time.Second)
	b := h.as(h.holder, ft.Batch(f.fence(),
		ft.Stamped(ft.WithIno(ft.Mkdir("/d/sub", 0o750), f.first), stamp),
		ft.Stamped(ft.WithIno(ft.Create("/d/sub/f"), f.first+1), stamp+1),
		ft.Stamped(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Ino(f.first + 1), Data: []byte("hello")}}}, stamp+2),
		ft.Stamped(ft.Rename("/d/sub/f", "/d/sub/g"), stamp+3),
		ft.Stamped(ft.WithIno(ft.Symlink("sub/g", "/d/l"), f.first+5), stamp+4),
		ft.Stamped(ft.Unlink("/d/a"), stamp+5),
	))
	r := h.Must(b)
	require.Len(t, r.Results, 6)
	mk, cr, wr, rn, sl := r.Results[0], r.Results[1], r.Results[2], r.Results[3], r.Results[4]
	require.Equal(t, f.first, mk.Attr.Ino)
	require.Equal(t, f.epoch, mk.Attr.Generation)
	require.Equal(t, h.Index, mk.Epoch, "a create in a directory held exclusively hands out a capability")
	require.Equal(t, f.first+1, cr.Attr.Ino)
	require.NotZero(t, cr.Handle)
	require.EqualValues(t, 5, wr.N)
	require.Equal(t, f.first+1, rn.Attr.Ino)
	require.Equal(t, f.first+5, sl.Attr.Ino)
	require.Zero(t, r.Results[5].Errno)

	require.Equal(t, "hello", string(h.MustQ(ft.Read("/d/sub/g", 0, 10)).Data))
	require.Equal(t, "sub/g", h.MustQ(ft.Readlink("/d/l")).Target)
	require.Equal(t, syscall.ENOENT, errnoOf(h.Q(ft.Stat("/d/a"))))
	sub := h.MustQ(ft.Stat("/d/sub")).Attr
	require.Equal(t, stamp, sub.AtimeNs)
	require.Equal(t, stamp+3, sub.MtimeNs, "the rename's stamp")
	require.Equal(t, stamp+5, h.MustQ(ft.Stat("/d")).Attr.MtimeNs, "the unlink's stamp")
	require.Equal(t, []uint64{h.holder}, h.F.CapHolders(h.Time)(f.first+1))

	// Recorded once: the same (session, seq) answers from the record.
	again := h.Do(b)
	require.True(t, proto.Equal(r, again), "%v\n%v", r, again)
	restored(t, snapBytes(t, h.F))
}

func TestBatchStamps(t *testing.T) {
	tests := []struct {
		name   string
		offset time.Duration // stamp minus the entry's time
		kept   bool
	}{
		{"a second before", -time.Second, true},
		{"the entry's time", 0, true},
		{"60 s before", -60 * time.Second, true},
		{"over 60 s before", -60*time.Second - 1, false},
		{"after the entry", 1, false},
		{"none", 0, false}, // stamp_ns 0
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBatchFixture(t)
			h := f.capHarness
			entry := h.Time
			stamp := entry + int64(tc.offset)
			if tc.name == "none" {
				stamp = 0
			}
			want := entry
			if tc.kept {
				want = stamp
			}
			now := uint32(pb.SetAttrBit_SET_MTIME_NOW | pb.SetAttrBit_SET_ATIME_NOW)
			r := h.Must(h.as(h.holder, ft.Batch(nil,
				ft.Stamped(ft.Mkdir("/d/n", 0o755), stamp),
				ft.Stamped(ft.SetAttr(ft.Path("/d/b"), &pb.SetAttrCmd{Valid: now}), stamp),
			)))
			a := r.Results[0].Attr
			require.Equal(t, []int64{want, want, want}, []int64{a.AtimeNs, a.MtimeNs, a.CtimeNs})
			d := h.MustQ(ft.Stat("/d")).Attr
			require.Equal(t, []int64{want, want}, []int64{d.MtimeNs, d.CtimeNs})
			b := r.Results[1].Attr
			require.Equal(t, []int64{want, want, want}, []int64{b.AtimeNs, b.MtimeNs, b.CtimeNs})
		})
	}
	// Outside a batch a stamp means nothing.
	f := newBatchFixture(t)
	entry := f.Time
	r := f.Must(ft.Stamped(ft.Mkdir("/e", 0o755), entry-time.Second.Nanoseconds()))
	require.Equal(t, entry, r.Attr.MtimeNs)
}

// TestBatchIsAtomic: a batch whose third command fails leaves everything
// as a command that changed nothing would: the tree, the block store's
// counts, sessions, capabilities, reservations and inode numbers; it
// records its failure and nothing else, and its entry reports no change.
func TestBatchIsAtomic(t *testing.T) {
	fail := ft.Mkdir("/d", 0o755) // EEXIST
	tests := []struct {
		name   string
		before func(f *batchFixture) []*pb.Command
	}{
		{"new data", func(f *batchFixture) []*pb.Command {
			return []*pb.Command{
				ft.Write("/d/a", cs, chunks(3, 40)),
				put("/d/c", string(chunks(2, 50))),
			}
		}},
		{"data released", func(f *batchFixture) []*pb.Command {
			return []*pb.Command{ft.Unlink("/d/b"), ft.Truncate("/d/a", 1)}
		}},
		{"data moved", func(f *batchFixture) []*pb.Command {
			return []*pb.Command{ft.Write("/d/a", 0, chunks(3, 11)), ft.Unlink("/d/b")}
		}},
		{"names and numbers", func(f *batchFixture) []*pb.Command {
			return []*pb.Command{
				ft.WithIno(ft.Mkdir("/d/x", 0o755), f.first+2),
				ft.Rename("/d/a", "/d/x/a"),
			}
		}},
		{"handles and exclusive opens", func(f *batchFixture) []*pb.Command {
			return []*pb.Command{
				ft.OpenExcl("/d/b", ft.ORdwr|ft.OTrunc, false),
				ft.WithIno(ft.Create("/d/y"), f.first+9), // uses the reservation up
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// ref sees a Tick where f sees the batch: nothing else differs.
			f, ref := newBatchFixture(t), newBatchFixture(t)
			cmds := append(tc.before(f), fail, ft.Mkdir("/d/z", 0o755))
			bc := f.as(f.holder, ft.Batch(f.fence(), cmds...))
			r := f.Do(bc)
			require.Equal(t, syscall.EEXIST, errnoOf(r), r.Message)
			require.EqualValues(t, 3, r.Failed)
			require.Contains(t, r.Message, "command 3 of the batch (mkdir)")
			require.Empty(t, r.Results)
			ev := f.events[len(f.events)-1]
			require.Empty(t, ev.Inodes)
			require.Empty(t, ev.Entries)
			tick := ref.as(ref.holder, ft.Tick())
			ref.Must(tick)

			require.Equal(t, dump(t, ref.F), dump(t, f.F))
			require.Equal(t, ref.F.Stats(), f.F.Stats())
			// The failure is recorded: the same (session, seq) answers it.
			again := f.Do(bc)
			require.True(t, proto.Equal(r, again), "%v\n%v", r, again)
			ref.Must(tick)
			// With both records acknowledged, the states are the same to
			// the byte: nothing but the batch's result was recorded.
			for _, x := range []*capHarness{f.capHarness, ref.capHarness} {
				k := x.as(x.holder, ft.KeepAlive())
				k.Ack = k.Seq
				x.Must(k)
			}
			require.True(t, bytes.Equal(snapBytes(t, ref.F), snapBytes(t, f.F)), "the snapshots differ")
			require.Equal(t, ref.F.Stats(), f.F.Stats())

			// The numbers are still free: the same batch without its
			// failing command applies.
			ok := append(tc.before(f), ft.Mkdir("/d/z", 0o755))
			f.Must(f.as(f.holder, ft.Batch(f.fence(), ok...)))
			restored(t, snapBytes(t, f.F))
		})
	}
}

// TestBatchFencing: a fence (ino, e) holds while the session has held an
// exclusive capability on ino without a break since e, re-grants
// included; once it was given up or taken, the old fences are refused.
func TestBatchFencing(t *testing.T) {
	tests := []struct {
		name   string
		fences func(f *batchFixture) []*pb.CapRef
		want   syscall.Errno
	}{
		{"held exclusively", func(f *batchFixture) []*pb.CapRef { return f.fence() }, 0},
		{"no fences", func(*batchFixture) []*pb.CapRef { return nil }, 0},
		{"another epoch", func(f *batchFixture) []*pb.CapRef { return []*pb.CapRef{ft.Fence(f.d, f.dEpoch-1)} }, syscall.EKEYREVOKED},
		{"not held", func(f *batchFixture) []*pb.CapRef { return []*pb.CapRef{f.fence()[0], ft.Fence(f.a, f.dEpoch)} }, syscall.EKEYREVOKED},
		{"shared", func(f *batchFixture) []*pb.CapRef {
			g := f.Must(f.as(f.holder, ft.Grant(false, f.b)))
			return []*pb.CapRef{ft.Fence(f.b, g.Epoch)}
		}, syscall.EKEYREVOKED},
		{"another session's", func(f *batchFixture) []*pb.CapRef {
			g := f.Must(f.as(f.other, ft.GrantExcl(f.b)))
			return []*pb.CapRef{ft.Fence(f.b, g.Epoch)}
		}, syscall.EKEYREVOKED},
		{"released", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Release(f.d, f.dEpoch)))
			return f.fence()
		}, syscall.EKEYREVOKED},
		{"recalled, not yet revoked", func(f *batchFixture) []*pb.CapRef {
			require.True(t, f.Do(f.as(f.other, ft.Create("/d/o"))).Recall)
			return f.fence()
		}, 0},
		{"revoked", func(f *batchFixture) []*pb.CapRef {
			require.True(t, f.Do(f.as(f.other, ft.Create("/d/o"))).Recall)
			f.Advance(1500 * time.Millisecond)
			f.Must(f.as(f.holder, ft.KeepAlive()))
			f.Advance(600 * time.Millisecond) // a lease (2 s) after the recall
			f.Must(f.as(f.holder, ft.KeepAlive()))
			require.True(t, f.recalls()[0].Revoked)
			return f.fence()
		}, syscall.EKEYREVOKED},
		{"after its latest grant", func(f *batchFixture) []*pb.CapRef { return []*pb.CapRef{ft.Fence(f.d, f.dEpoch+1)} }, syscall.EKEYREVOKED},

		// Tenure: a capability granted again while held keeps the fences
		// of its earlier epochs.
		{"granted again with entries", func(f *batchFixture) []*pb.CapRef {
			require.Greater(t, f.Must(f.as(f.holder, ft.Grant(true, f.d))).Epoch, f.dEpoch)
			return f.fence()
		}, 0},
		{"granted again shared", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Grant(false, f.d)))
			return f.fence()
		}, 0},
		{"granted again, between the grants", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Grant(true, f.d)))
			return []*pb.CapRef{ft.Fence(f.d, f.dEpoch+1)}
		}, 0},
		{"granted again, the new epoch", func(f *batchFixture) []*pb.CapRef {
			g := f.Must(f.as(f.holder, grantExclEntries(f.d)))
			return []*pb.CapRef{ft.Fence(f.d, g.Epoch), ft.Fence(f.a, g.Epoch)}
		}, 0},
		{"granted again, before the tenure", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Grant(true, f.d)))
			return []*pb.CapRef{ft.Fence(f.d, f.dEpoch-1)}
		}, syscall.EKEYREVOKED},
		{"granted again exclusively with entries, an entry's tenure begins there", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, grantExclEntries(f.d)))
			return []*pb.CapRef{ft.Fence(f.a, f.dEpoch)}
		}, syscall.EKEYREVOKED},
		{"a create's capability, granted again with its directory", func(f *batchFixture) []*pb.CapRef {
			c := f.Must(f.as(f.holder, ft.Create("/d/c")))
			f.Must(f.as(f.holder, ft.Grant(true, f.d)))
			return []*pb.CapRef{f.fence()[0], ft.Fence(ino(t, f.Harness, "/d/c"), c.Epoch)}
		}, 0},
		{"shared, then exclusive", func(f *batchFixture) []*pb.CapRef {
			s := f.Must(f.as(f.holder, ft.Grant(false, f.b)))
			f.Must(f.as(f.holder, ft.GrantExcl(f.b)))
			return []*pb.CapRef{ft.Fence(f.b, s.Epoch)}
		}, 0},
		{"granted again, through a snapshot", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Grant(true, f.d)))
			snap := snapBytes(t, f.F)
			f.F = restored(t, snap)
			require.Equal(t, snap, snapBytes(t, f.F))
			return f.fence()
		}, 0},
		{"released and granted again", func(f *batchFixture) []*pb.CapRef {
			f.Must(f.as(f.holder, ft.Release(f.d, f.dEpoch)))
			f.Must(f.as(f.holder, ft.GrantExcl(f.d)))
			return f.fence()
		}, syscall.EKEYREVOKED},
		{"revoked and granted again", func(f *batchFixture) []*pb.CapRef {
			require.True(t, f.Do(f.as(f.other, ft.Create("/d/o"))).Recall)
			f.Advance(1500 * time.Millisecond)
			f.Must(f.as(f.holder, ft.KeepAlive()))
			f.Advance(600 * time.Millisecond)
			f.Must(f.as(f.holder, ft.KeepAlive()))
			require.True(t, f.recalls()[0].Revoked)
			f.Must(f.as(f.holder, ft.GrantExcl(f.d)))
			return f.fence()
		}, syscall.EKEYREVOKED},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBatchFixture(t)
			fences := tc.fences(f)
			before := dump(t, f.F)
			r := f.Do(f.as(f.holder, ft.Batch(fences, ft.Mkdir("/d/n", 0o755), ft.Unlink("/d/a"))))
			require.Equal(t, tc.want, errnoOf(r), r.Message)
			if tc.want != 0 {
				require.Zero(t, r.Failed, "a fence names no command")
				require.Equal(t, before, dump(t, f.F))
				return
			}
			require.Len(t, r.Results, 2)
		})
	}
}

// grantExclEntries asks for exclusive capabilities on inos and their
// entries.
func grantExclEntries(inos ...uint64) *pb.Command {
	c := ft.Grant(true, inos...)
	c.GetGrant().Exclusive = true
	return c
}

// TestBatchRecall: a batch that would change an inode another session
// holds a capability on is refused for a recall like a single command:
// nothing applied, nothing recorded, the holder asked once; it applies
// once the capability is released, or revoked when it is not.
func TestBatchRecall(t *testing.T) {
	for _, release := range []bool{true, false} {
		f := newBatchFixture(t)
		g := f.Must(f.as(f.other, ft.Grant(false, f.b)))
		before := dump(t, f.F)
		b := f.as(f.holder, ft.Batch(f.fence(), ft.WithIno(ft.Mkdir("/d/n", 0o755), f.first), ft.Unlink("/d/b")))
		r := f.Do(b)
		require.True(t, r.Recall)
		require.Equal(t, syscall.EAGAIN, errnoOf(r))
		require.Equal(t, []*pb.Recall{{Session: f.other, Ino: f.b, Epoch: g.Epoch}}, protoClean(f.recalls()))
		ev := f.events[len(f.events)-1]
		require.Empty(t, ev.Inodes, "the batch's changes are not announced")
		require.Equal(t, before, dump(t, f.F))
		require.True(t, f.Do(b).Recall, "not recorded: applied again, still waiting")
		require.Empty(t, f.recalls(), "recalled once")
		if release {
			f.Must(f.as(f.other, ft.Release(f.b, g.Epoch)))
		} else {
			// Revoked a lease after the recall, though the batch was
			// rolled back: its recall stands.
			f.Advance(1500 * time.Millisecond)
			f.Must(f.as(f.other, ft.KeepAlive()))
			f.Must(f.as(f.holder, ft.KeepAlive()))
			f.Advance(600 * time.Millisecond)
			f.Must(f.as(f.holder, ft.KeepAlive()))
			require.Equal(t, []*pb.Recall{{Session: f.other, Ino: f.b, Epoch: g.Epoch, Revoked: true}}, protoClean(f.recalls()))
		}
		r = f.Must(b)
		require.Len(t, r.Results, 2)
		require.Equal(t, f.first, r.Results[0].Attr.Ino)
		require.Equal(t, syscall.ENOENT, errnoOf(f.Q(ft.Stat("/d/b"))))
	}
}

func TestBatchRefusals(t *testing.T) {
	ok := ft.Mkdir("/d/n", 0o755)
	withSeq := ft.Mkdir("/d/m", 0o755)
	withSeq.Seq = 1
	tests := []struct {
		name    string
		cmds    []*pb.Command
		session bool
		want    syscall.Errno
		failed  uint32
	}{
		{"no session", []*pb.Command{ok}, false, syscall.ESTALE, 0},
		{"too many", make([]*pb.Command, 4097), true, syscall.E2BIG, 0},
		{"no operation", []*pb.Command{ok, {}}, true, syscall.EINVAL, 2},
		{"nested seq", []*pb.Command{ok, withSeq}, true, syscall.EINVAL, 2},
		{"nested session", []*pb.Command{{Session: 1, Op: ok.Op}}, true, syscall.EINVAL, 1},
		{"grant", []*pb.Command{ok, ft.Grant(false, 1)}, true, syscall.EINVAL, 2},
		{"release", []*pb.Command{ft.Release(1, 1)}, true, syscall.EINVAL, 1},
		{"clone", []*pb.Command{ft.Clone("/d/a", "/d/c", false)}, true, syscall.EINVAL, 1},
		{"tick", []*pb.Command{ft.Tick()}, true, syscall.EINVAL, 1},
		{"keep_alive", []*pb.Command{ft.KeepAlive()}, true, syscall.EINVAL, 1},
		{"close_session", []*pb.Command{ft.CloseSession()}, true, syscall.EINVAL, 1},
		{"open_session", []*pb.Command{ft.OpenSession(1000)}, true, syscall.EINVAL, 1},
		{"reserve_inodes", []*pb.Command{ft.ReserveInodes(1)}, true, syscall.EINVAL, 1},
		{"touch", []*pb.Command{ft.Touch(1)}, true, syscall.EINVAL, 1},
		{"batch", []*pb.Command{ft.Batch(nil, ok)}, true, syscall.EINVAL, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBatchFixture(t)
			before := dump(t, f.F)
			c := ft.Batch(nil, tc.cmds...)
			if tc.session {
				c = f.as(f.holder, c)
			}
			r := f.Do(c)
			require.Equal(t, tc.want, errnoOf(r), r.Message)
			require.Equal(t, tc.failed, r.Failed)
			require.Equal(t, before, dump(t, f.F))
		})
	}
}
