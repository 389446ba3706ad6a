package fsm_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// creators are the commands that may name a reserved inode number.
var creators = map[string]func(p string) *pb.Command{
	"open":    ft.Create,
	"mkdir":   func(p string) *pb.Command { return ft.Mkdir(p, 0o755) },
	"mknod":   func(p string) *pb.Command { return ft.Mknod(p, 0o010644, 0) },
	"symlink": func(p string) *pb.Command { return ft.Symlink("/t", p) },
}

// reserveFixture is a state with two sessions, each holding a
// reservation of ten numbers.
type reserveFixture struct {
	h                   *ft.Harness
	mine, other         uint64
	first, epoch, their uint64
}

func newReserveFixture(t *testing.T) *reserveFixture {
	f := &reserveFixture{h: ft.New(t, fsm.Config{ChunkSize: cs})}
	f.other = f.h.OpenSession(10_000)
	f.their = f.h.Must(f.h.Sess(ft.ReserveInodes(10))).FirstIno
	f.mine = f.h.OpenSession(10_000)
	r := f.h.Must(f.h.Sess(ft.ReserveInodes(10)))
	f.first, f.epoch = r.FirstIno, r.Epoch
	require.Equal(t, f.h.Index, r.Epoch)
	require.EqualValues(t, 10, r.N)
	return f
}

func TestCreateWithReservedIno(t *testing.T) {
	tests := []struct {
		name    string
		before  []uint64 // numbers the session takes first, in order
		ino     func(f *reserveFixture) uint64
		session func(f *reserveFixture) uint64
		want    syscall.Errno
		// wantOpen, when set, is the open's errno (an open needs a
		// session before anything else).
		wantOpen syscall.Errno
	}{
		{name: "first", ino: func(f *reserveFixture) uint64 { return f.first }},
		{name: "last", ino: func(f *reserveFixture) uint64 { return f.first + 9 }},
		{name: "skipping some", before: []uint64{2}, ino: func(f *reserveFixture) uint64 { return f.first + 7 }},
		{name: "past the range", ino: func(f *reserveFixture) uint64 { return f.first + 10 }, want: syscall.EINVAL},
		{name: "below one used", before: []uint64{5}, ino: func(f *reserveFixture) uint64 { return f.first + 4 }, want: syscall.EINVAL},
		{name: "used again", before: []uint64{5}, ino: func(f *reserveFixture) uint64 { return f.first + 5 }, want: syscall.EINVAL},
		{name: "another session's", ino: func(f *reserveFixture) uint64 { return f.their }, want: syscall.EINVAL},
		{name: "an existing inode", ino: func(*reserveFixture) uint64 { return 1 }, want: syscall.EINVAL},
		{
			name: "without a session", ino: func(f *reserveFixture) uint64 { return f.first },
			session: func(*reserveFixture) uint64 { return 0 }, want: syscall.EINVAL, wantOpen: syscall.ESTALE,
		},
	}
	for kind, create := range creators {
		for _, tc := range tests {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				f := newReserveFixture(t)
				for i, off := range tc.before {
					f.h.Must(f.h.Sess(ft.WithIno(ft.Mkdir("/before"+string(rune('a'+i)), 0o755), f.first+off)))
				}
				before := dump(t, f.h.F)
				c := ft.WithIno(create("/new"), tc.ino(f))
				if tc.session != nil {
					c.Session = tc.session(f)
				} else {
					f.h.Sess(c)
				}
				r := f.h.Do(c)
				want := tc.want
				if kind == "open" && tc.wantOpen != 0 {
					want = tc.wantOpen
				}
				require.Equal(t, want, errnoOf(r), r.Message)
				if want != 0 {
					require.Equal(t, before, dump(t, f.h.F), "a refused create changed the state")
					return
				}
				require.Equal(t, tc.ino(f), r.Attr.Ino)
				require.Equal(t, f.epoch, r.Attr.Generation, "the generation is the reservation's index")
				require.Equal(t, r.Attr.Ino, ino(t, f.h, "/new"))
				// The cluster's own numbers come after every reservation.
				next := f.h.Must(ft.Mkdir("/plain", 0o755)).Attr.Ino
				require.Equal(t, f.first+10, next)
				restored(t, snapBytes(t, f.h.F))
			})
		}
	}
}

func TestReserveInodes(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	require.Equal(t, syscall.ESTALE, errnoOf(h.Do(ft.ReserveInodes(1))), "needs a session")
	h.OpenSession(1000)
	for _, n := range []uint32{0, 1<<16 + 1} {
		require.Equal(t, syscall.EINVAL, errnoOf(h.Do(h.Sess(ft.ReserveInodes(n)))), "count %d", n)
	}
	first := h.Must(h.Sess(ft.ReserveInodes(1 << 16))).FirstIno
	require.EqualValues(t, 2, first, "numbers follow the root")
	prev := first + 1<<16
	for range 3 {
		r := h.Must(h.Sess(ft.ReserveInodes(2)))
		require.Equal(t, prev, r.FirstIno, "reservations do not overlap")
		prev += 2
	}
	require.Equal(t, syscall.E2BIG, errnoOf(h.Do(h.Sess(ft.ReserveInodes(1)))), "a fifth reservation")

	// A reservation used up no longer counts.
	h.Must(h.Sess(ft.WithIno(ft.Create("/x"), prev-1)))
	again := h.Must(h.Sess(ft.ReserveInodes(1)))
	require.Equal(t, prev, again.FirstIno)

	// The numbers of an ended session are nobody's: not its successor's,
	// and never handed out again.
	h.Advance(2 * time.Second)
	h.Must(ft.Tick())
	require.Equal(t, syscall.ESTALE, errnoOf(h.Do(h.Sess(ft.Mkdir("/late", 0o755)))))
	h.OpenSession(1000)
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(h.Sess(ft.WithIno(ft.Mkdir("/d", 0o755), first)))))
	require.Equal(t, prev+1, h.Must(h.Sess(ft.Mkdir("/d", 0o755))).Attr.Ino)
}

// TestCreateIgnoresInoOfExistingFile: an open with O_CREAT that finds the
// file opens it, whatever number it names.
func TestCreateIgnoresInoOfExistingFile(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.OpenSession(10_000)
	h.Must(h.Sess(ft.Create("/f")))
	f := ino(t, h, "/f")
	r := h.Must(h.Sess(ft.WithIno(ft.Create("/f"), 999)))
	require.Equal(t, f, r.Attr.Ino)
}

// TestReservationsInSnapshots: reservations, partly used, survive a
// snapshot and restore, which writes them back byte for byte and goes on
// refusing the numbers used and accepting the rest.
func TestReservationsInSnapshots(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	s := h.OpenSession(10_000)
	a := h.Must(h.Sess(ft.ReserveInodes(4)))
	b := h.Must(h.Sess(ft.ReserveInodes(3)))
	h.Must(h.Sess(ft.WithIno(ft.Mkdir("/d", 0o755), a.FirstIno+1)))
	snap := snapBytes(t, h.F)
	g := restored(t, snap)
	require.Equal(t, snap, snapBytes(t, g))

	r := ft.New(t, fsm.Config{ChunkSize: cs})
	r.F, r.Index, r.Time, r.Session = g, h.Index, h.Time, s
	for i, tc := range []struct {
		ino  uint64
		want syscall.Errno
		gen  uint64
	}{
		{a.FirstIno, syscall.EINVAL, 0},
		{a.FirstIno + 1, syscall.EINVAL, 0},
		{a.FirstIno + 3, 0, a.Epoch},
		{b.FirstIno + 2, 0, b.Epoch},
		{b.FirstIno + 2, syscall.EINVAL, 0},
	} {
		c := ft.WithIno(ft.Mkdir(fmt.Sprintf("/x%d", i), 0o755), tc.ino)
		c.Session, c.Seq = s, uint64(100+i)
		res := r.Do(c)
		require.Equal(t, tc.want, errnoOf(res), "ino %d: %s", tc.ino, res.Message)
		if tc.want == 0 {
			require.Equal(t, tc.gen, res.Attr.Generation)
		}
	}
	restored(t, snapBytes(t, r.F))
}
