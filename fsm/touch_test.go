package fsm_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/proto"
)

func TestTouch(t *testing.T) {
	tests := []struct {
		name    string
		grant   func(h *capHarness, f uint64) *pb.Command // the capability on f, if any
		session func(h *capHarness) uint64                // the touch's
		recall  bool
	}{
		{name: "no capability", session: func(h *capHarness) uint64 { return h.other }},
		{
			name:    "another's exclusive",
			grant:   func(h *capHarness, f uint64) *pb.Command { return h.as(h.holder, ft.GrantExcl(f)) },
			session: func(h *capHarness) uint64 { return h.other }, recall: true,
		},
		{
			name:    "another's shared",
			grant:   func(h *capHarness, f uint64) *pb.Command { return h.as(h.holder, ft.Grant(false, f)) },
			session: func(h *capHarness) uint64 { return h.other },
		},
		{
			name:    "its own exclusive",
			grant:   func(h *capHarness, f uint64) *pb.Command { return h.as(h.holder, ft.GrantExcl(f)) },
			session: func(h *capHarness) uint64 { return h.holder },
		},
		{
			name:    "without a session",
			grant:   func(h *capHarness, f uint64) *pb.Command { return h.as(h.holder, ft.GrantExcl(f)) },
			session: func(*capHarness) uint64 { return 0 }, recall: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newCapHarness(t)
			h.Must(put("/f", "x"))
			f := ino(t, h.Harness, "/f")
			var epoch uint64
			if tc.grant != nil {
				epoch = h.Must(tc.grant(h, f)).Epoch
			}
			before := dump(t, h.F)
			c := ft.Touch(f, 1, f) // named twice: recalled once
			c.Session = tc.session(h)
			r := h.Do(c)
			require.Equal(t, before, dump(t, h.F), "a touch changes nothing")
			require.Empty(t, h.events[len(h.events)-1].Inodes)
			if !tc.recall {
				require.Zero(t, r.Errno, r.Message)
				require.Empty(t, h.recalls())
				return
			}
			require.True(t, r.Recall)
			require.Equal(t, syscall.EAGAIN, errnoOf(r))
			require.Equal(t, []*pb.Recall{{Session: h.holder, Ino: f, Epoch: epoch}}, protoClean(h.recalls()))
			require.True(t, h.Do(c).Recall)
			h.Must(h.as(h.holder, ft.Release(f, epoch)))
			require.Zero(t, h.Do(c).Errno)
		})
	}
	h := newCapHarness(t)
	c := ft.Touch(1)
	c.Session = 99
	require.Equal(t, syscall.ESTALE, errnoOf(h.Do(c)))
}

func TestBufferedBy(t *testing.T) {
	h := newCapHarness(t)
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(ft.Mkdir("/d/e", 0o755))
	h.Must(put("/d/e/f", "x"))
	h.Must(ft.Symlink("/d/e", "/l"))
	d, e, f := ino(t, h.Harness, "/d"), ino(t, h.Harness, "/d/e"), ino(t, h.Harness, "/d/e/f")
	require.Nil(t, h.F.BufferedBy(ft.Stat("/d"), h.other), "no exclusive capability")
	g := h.Must(h.as(h.holder, ft.GrantExcl(d)))
	hd := h.Must(h.as(h.holder, ft.Open("/d/e/f", ft.ORdonly, 0))).Handle
	plus := ft.ReadDir("/", "", 0)
	plus.GetReadDir().Plus = true
	tests := []struct {
		name string
		q    *pb.Query
		want []uint64
	}{
		{"a path through it", ft.Stat("/d/e/f"), []uint64{d}},
		{"it", ft.Stat("/d"), []uint64{d}},
		{"a name missing in it", ft.Stat("/d/nothing"), []uint64{d}},
		{"by number, below it", ft.StatLoc(ft.Ino(f)), nil},
		{"an entry of it by parent and name", ft.StatLoc(ft.At(d, "e")), []uint64{d}},
		{"an entry of another", ft.StatLoc(ft.At(e, "f")), nil},
		{"through a symlink", ft.Stat("/l/f"), []uint64{d}},
		{"the symlink", ft.Readlink("/l"), nil},
		{"its listing", ft.ReadDir("/d", "", 0), []uint64{d}},
		{"its parent's listing", ft.ReadDir("/", "", 0), nil},
		{"its parent's listing with attributes", plus, []uint64{d}},
		{"xattrs", ft.ListXattr("/d"), []uint64{d}},
		{"a read by handle", ft.ReadH(hd, 0, 1), nil},
		{"a read by path", ft.Read("/d/e/f", 0, 1), []uint64{d}},
		{"usage", ft.Usage("/d"), []uint64{d}},
		{"statfs", ft.Statfs(), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, h.F.BufferedBy(tc.q, h.other))
			require.Empty(t, h.F.BufferedBy(tc.q, h.holder), "its holder's own reads")
		})
	}
	// Once shared, nothing is buffered.
	h.Must(h.as(h.holder, ft.Release(d, g.Epoch)))
	h.Must(h.as(h.holder, ft.Grant(false, d)))
	require.Empty(t, h.F.BufferedBy(ft.Stat("/d/e/f"), h.other))
}
