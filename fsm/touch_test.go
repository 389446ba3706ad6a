package fsm_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
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

// TestCommandsWaitForBufferedDirectories: a command of another session
// that resolves a name in a directory held exclusively (or reaches an
// inode held so) may be answering from a state the holder is ahead of. It
// waits like a conflicting change, whatever it would have answered; once
// the holder has sent what it buffered and released, it applies against
// that.
func TestCommandsWaitForBufferedDirectories(t *testing.T) {
	removeAt := func(parent uint64, name string) *pb.Command {
		return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: ft.At(parent, name)}}}
	}
	stat := func(loc *pb.Loc) *pb.Command { return ft.SetAttr(loc, &pb.SetAttrCmd{}) }
	type fixture struct {
		*capHarness
		d, e, x, z uint64
	}
	tests := []struct {
		name     string
		held     []string // held exclusively by the holder; /d when none
		cmd      func(f *fixture) *pb.Command
		buffered []*pb.Command // what the holder answered and sends when recalled
		recalled []string      // whose capabilities the command recalls; held when none
		want     syscall.Errno
		check    func(t *testing.T, f *fixture, r *pb.Result)
	}{
		{
			name:     "remove of a name the holder made",
			cmd:      func(*fixture) *pb.Command { return ft.Remove("/d/n") },
			buffered: []*pb.Command{ft.Mkdir("/d/n", 0o755)},
			check: func(t *testing.T, f *fixture, _ *pb.Result) {
				require.Equal(t, syscall.ENOENT, errnoOf(f.Q(ft.Stat("/d/n"))))
			},
		},
		{
			name:     "remove by parent and name",
			cmd:      func(f *fixture) *pb.Command { return removeAt(f.d, "n") },
			buffered: []*pb.Command{ft.Mkdir("/d/n", 0o755)},
		},
		{
			name:     "remove through a symlink",
			cmd:      func(*fixture) *pb.Command { return ft.Remove("/l/n") },
			buffered: []*pb.Command{ft.Mkdir("/d/n", 0o755)},
		},
		{
			name:     "mkdir of a name the holder removed",
			cmd:      func(*fixture) *pb.Command { return ft.Mkdir("/d/x", 0o700) },
			buffered: []*pb.Command{ft.Unlink("/d/x")},
			check: func(t *testing.T, f *fixture, r *pb.Result) {
				require.EqualValues(t, 0o700, f.MustQ(ft.Stat("/d/x")).Attr.Mode&0o777)
			},
		},
		{
			name:     "rename into a directory the holder made",
			cmd:      func(*fixture) *pb.Command { return ft.Rename("/e/f", "/d/sub/f") },
			buffered: []*pb.Command{ft.Mkdir("/d/sub", 0o755)},
			check: func(t *testing.T, f *fixture, _ *pb.Result) {
				require.Equal(t, "f", string(f.MustQ(ft.Read("/d/sub/f", 0, 10)).Data))
			},
		},
		{
			name:     "create over a name the holder removed",
			cmd:      func(*fixture) *pb.Command { return ft.Create("/d/z") },
			buffered: []*pb.Command{ft.Unlink("/d/z")},
			check: func(t *testing.T, f *fixture, _ *pb.Result) {
				a := f.MustQ(ft.Stat("/d/z")).Attr
				require.NotEqual(t, f.z, a.Ino, "a new file")
				require.Zero(t, a.Size)
			},
		},
		{
			name:     "exclusive create of a name the holder removed",
			cmd:      func(*fixture) *pb.Command { return ft.Open("/d/z", ft.OCreat|ft.OExcl|ft.ORdwr, 0o644) },
			buffered: []*pb.Command{ft.Unlink("/d/z")},
		},
		{
			name:     "stat by command of a name the holder removed",
			cmd:      func(*fixture) *pb.Command { return stat(ft.Path("/d/x")) },
			buffered: []*pb.Command{ft.Unlink("/d/x")},
			want:     syscall.ENOENT,
		},
		{
			name:     "stat by number of a file the holder wrote",
			held:     []string{"/d/x"},
			cmd:      func(f *fixture) *pb.Command { return stat(ft.Ino(f.x)) },
			buffered: []*pb.Command{ft.Write("/d/x", 0, []byte("longer"))},
			check: func(t *testing.T, f *fixture, r *pb.Result) {
				require.EqualValues(t, 6, r.Attr.Size)
			},
		},
		{
			name:     "link onto a name the holder removed",
			cmd:      func(*fixture) *pb.Command { return ft.Link("/e/f", "/d/x") },
			buffered: []*pb.Command{ft.Unlink("/d/x")},
		},
		{
			name:     "recursive clone of a tree with a directory held below",
			held:     []string{"/t/u"},
			cmd:      func(*fixture) *pb.Command { return ft.Clone("/t", "/c", true) },
			buffered: []*pb.Command{ft.Mkdir("/t/u/new", 0o755)},
			check: func(t *testing.T, f *fixture, _ *pb.Result) {
				f.MustQ(ft.Stat("/c/u/new"))
			},
		},
		{
			name:     "a batch of another session",
			cmd:      func(*fixture) *pb.Command { return ft.Batch(nil, ft.Mkdir("/e/m", 0o755), ft.Remove("/d/n")) },
			buffered: []*pb.Command{ft.Mkdir("/d/n", 0o755)},
			check: func(t *testing.T, f *fixture, _ *pb.Result) {
				f.MustQ(ft.Stat("/e/m"))
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fixture{capHarness: newCapHarness(t)}
			for _, c := range []*pb.Command{
				ft.Mkdir("/d", 0o755), put("/d/x", "x"), put("/d/z", "z"), ft.Mkdir("/e", 0o755),
				put("/e/f", "f"), ft.Symlink("/d", "/l"), ft.Mkdir("/t", 0o755), ft.Mkdir("/t/u", 0o755),
			} {
				f.Must(c)
			}
			f.d, f.e, f.x, f.z = ino(t, f.Harness, "/d"), ino(t, f.Harness, "/e"), ino(t, f.Harness, "/d/x"), ino(t, f.Harness, "/d/z")
			held := tc.held
			if held == nil {
				held = []string{"/d"}
			}
			recalled := tc.recalled
			if recalled == nil {
				recalled = held
			}
			epochs := map[uint64]uint64{}
			var fences []*pb.CapRef
			for _, p := range held {
				i := ino(t, f.Harness, p)
				epochs[i] = f.Must(f.as(f.holder, ft.GrantExcl(i))).Epoch
				fences = append(fences, ft.Fence(i, epochs[i]))
			}
			var want []*pb.Recall
			for _, p := range recalled {
				i := ino(t, f.Harness, p)
				want = append(want, &pb.Recall{Session: f.holder, Ino: i, Epoch: epochs[i]})
			}

			c := f.as(f.other, tc.cmd(f))
			before := dump(t, f.F)
			r := f.Do(c)
			require.True(t, r.Recall, "answered without waiting: %v", r)
			require.Equal(t, syscall.EAGAIN, errnoOf(r))
			require.Equal(t, want, protoClean(f.recalls()))
			require.Equal(t, before, dump(t, f.F), "nothing changed")
			require.True(t, f.Do(c).Recall, "still waiting")
			require.Empty(t, f.recalls(), "recalled once")

			// The holder sends what it answered, then gives back what it
			// holds, the capabilities its creates handed out included.
			b := f.Must(f.as(f.holder, ft.Batch(fences, tc.buffered...)))
			for _, x := range b.Results {
				if x.Epoch != 0 {
					epochs[x.Attr.Ino] = x.Epoch
				}
			}
			for i, e := range epochs {
				f.Must(f.as(f.holder, ft.Release(i, e)))
			}
			require.Zero(t, f.F.CapCount())
			r = f.Do(c)
			require.Equal(t, tc.want, errnoOf(r), r.Message)
			if tc.check != nil {
				tc.check(t, f, r)
			}
		})
	}
}

// TestCommandsPassUnbufferedDirectories: only another session's exclusive
// capability makes a resolution wait; the holder's own commands, batches
// included, answer at once.
func TestCommandsPassUnbufferedDirectories(t *testing.T) {
	other := func(h *capHarness) uint64 { return h.other }
	holder := func(h *capHarness) uint64 { return h.holder }
	remove := func(p string) func(*capHarness) *pb.Command {
		return func(*capHarness) *pb.Command { return ft.Remove(p) }
	}
	tests := []struct {
		name      string
		exclusive bool
		session   func(h *capHarness) uint64
		cmd       func(h *capHarness) *pb.Command
		recall    bool
		want      syscall.Errno
	}{
		{"another session's", true, other, remove("/d/n"), true, 0},
		{"without a session", true, func(*capHarness) uint64 { return 0 }, remove("/d/n"), true, 0},
		{"its own", true, holder, remove("/d/n"), false, syscall.ENOENT},
		{"its own batch", true, holder, func(*capHarness) *pb.Command { return ft.Batch(nil, ft.Remove("/d/n")) }, false, syscall.ENOENT},
		{"shared", false, other, remove("/d/n"), false, syscall.ENOENT},
		{"another directory", true, other, remove("/e/n"), false, syscall.ENOENT},
		{"the directory by number", true, other, func(h *capHarness) *pb.Command {
			return ft.SetAttr(ft.Ino(ino(t, h.Harness, "/d")), &pb.SetAttrCmd{})
		}, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newCapHarness(t)
			h.Must(ft.Mkdir("/d", 0o755))
			h.Must(ft.Mkdir("/e", 0o755))
			d := ino(t, h.Harness, "/d")
			g := ft.Grant(false, d)
			g.GetGrant().Exclusive = tc.exclusive
			h.Must(h.as(h.holder, g))
			c := tc.cmd(h)
			if s := tc.session(h); s != 0 {
				c = h.as(s, c)
			}
			r := h.Do(c)
			require.Equal(t, tc.recall, r.Recall, r.Message)
			if tc.recall {
				require.Len(t, h.recalls(), 1)
				return
			}
			require.Empty(t, h.recalls())
			require.Equal(t, tc.want, errnoOf(r), r.Message)
		})
	}
}
