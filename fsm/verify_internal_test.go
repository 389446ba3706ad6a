package fsm

import (
	"os"
	"strconv"
	"strings"
	"testing"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// verifyFixture is a state with a directory, a file with data, a symlink,
// an open handle with an exclusive open, a recorded result and a
// reservation of the inode numbers 6 to 15.
func verifyFixture(t *testing.T) *FSM {
	f, err := New(Config{ChunkSize: 4096})
	require.NoError(t, err)
	cmds := []*pb.Command{
		{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 10_000}}},
		{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a"}, Mode: 0o755}}},
		{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a/b"}, Mode: 0o755}}},
		{Session: 1, Seq: 1, Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: &pb.Loc{Path: "/a/f"}, Flags: oCreat | oRdwr, Exclusive: true}}},
		{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Path: "/a/f"}, Data: []byte("data")}}},
		{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{Loc: &pb.Loc{Path: "/s"}, Target: "/a"}}},
		{Session: 1, Seq: 2, Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: 10}}},
	}
	for i, r := range f.Apply(1, &pb.Entry{Version: EntryVersion, TimeNs: 1e9, Commands: cmds}) {
		require.Zero(t, r.Errno, "command %d: %s", i, r.Message)
	}
	return f
}

func TestVerifyCatchesBrokenInvariants(t *testing.T) {
	const a, b, file, link = 2, 3, 4, 5
	edit := func(s *state, ino uint64, fn func(n *inode)) {
		n := *s.inode(ino)
		fn(&n)
		s.inodes.put(u64key(ino), &n)
	}
	reserve := func(s *state, rs ...inoRange) {
		x := *s.session(1)
		x.ranges = rs
		s.sessions.put(u64key(1), &x)
	}
	tests := []struct {
		name    string
		corrupt func(s *state)
		want    string
	}{
		{"entry names missing inode", func(s *state) { s.dirents.put(dirKey(a, "x"), dent{ino: 99, typ: modeReg}) }, "names inode 99"},
		{"entry type differs", func(s *state) { s.dirents.put(dirKey(a, "f"), dent{ino: file, typ: modeDir}) }, "type"},
		{"entry with bad name", func(s *state) { s.dirents.put(dirKey(a, "x/y"), dent{ino: file, typ: modeReg}) }, "bad name"},
		{"file nlink", func(s *state) { edit(s, file, func(n *inode) { n.nlink = 2 }) }, "nlink 2"},
		{"dir nlink", func(s *state) { edit(s, a, func(n *inode) { n.nlink = 2 }) }, "directory 2"},
		{"nameless and closed", func(s *state) { s.dirents.del(dirKey(1, "s")) }, "no name"},
		{"chunk past size", func(s *state) { edit(s, file, func(n *inode) { n.size = 2 }) }, "past its size"},
		{"chunk on a directory", func(s *state) { b0, _ := s.chunks.get(pairKey(file, 0)); s.chunks.put(pairKey(a, 0), b0) }, "not a regular file"},
		{"handle of missing session", func(s *state) { s.sessions.del(u64key(1)) }, "missing session"},
		{"lock names missing handle", func(s *state) { s.locks.put(u64key(file), &xlock{holder: 1, queue: []uint64{7}}) }, "names handle 7"},
		{"exclusive handle without lock", func(s *state) { s.locks.del(u64key(file)) }, "not in its inode's lock"},
		{"inode number past counter", func(s *state) { s.nextIno = 3 }, "next 3"},
		{"empty symlink", func(s *state) { edit(s, link, func(n *inode) { n.ext = nil }) }, "target of 0 bytes"},
		{"root missing", func(s *state) { s.inodes.del(u64key(rootIno)); s.ninodes-- }, "root"},
		{"inode count", func(s *state) { s.ninodes++ }, "header says"},
		{"reservation past the counter", func(s *state) { reserve(s, inoRange{next: 6, end: 17, epoch: 1}) }, "next inode 16"},
		{"reservation used up", func(s *state) { reserve(s, inoRange{next: 16, end: 16, epoch: 1}) }, "reservation [16, 16)"},
		{"reservation from the future", func(s *state) { reserve(s, inoRange{next: 6, end: 16, epoch: 2}) }, "made at 2"},
		{"reservations overlap", func(s *state) {
			reserve(s, inoRange{next: 6, end: 10, epoch: 1}, inoRange{next: 9, end: 16, epoch: 1})
		}, "overlap"},
		{"inode in a reservation", func(s *state) { reserve(s, inoRange{next: 5, end: 16, epoch: 1}) }, "inode 5 lies in"},
		{"capability's tenure after its epoch", func(s *state) {
			s.caps.put(pairKey(a, 1), &capab{session: 1, ino: a, epoch: 1, since: 2, excl: true})
		}, "tenure from 2"},
		{"capability without a tenure", func(s *state) {
			s.caps.put(pairKey(a, 1), &capab{session: 1, ino: a, epoch: 1, excl: true})
		}, "tenure from 0"},
		{"directory cycle off the root", func(s *state) {
			// a holds b; now b also holds a, and nothing holds a.
			s.dirents.del(dirKey(1, "a"))
			s.dirents.put(dirKey(b, "a"), dent{ino: a, typ: modeDir})
			edit(s, a, func(n *inode) { n.parent = b })
			edit(s, b, func(n *inode) { n.nlink = 3 })
			edit(s, rootIno, func(n *inode) { n.nlink = 2 })
		}, "reachable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := verifyFixture(t)
			s := *f.cur.Load()
			s.logical, s.minLease = 0, 0
			require.NoError(t, verify(&s), "the fixture itself must verify")
			s = *f.cur.Load()
			tc.corrupt(&s)
			s.commit()
			err := verify(&s)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestRestoreCapabilityTenure: a 'C' record written before tenures existed
// restores with its tenure beginning at its epoch; one that names a tenure
// keeps it, and one naming a tenure no earlier than its epoch (never
// written) is refused.
func TestRestoreCapabilityTenure(t *testing.T) {
	sinces := func(seed string) map[uint64]uint64 { // ino -> epoch - since
		b, err := os.ReadFile("testdata/fuzz/FuzzRestore/" + seed)
		require.NoError(t, err)
		q := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[1])
		q, err = strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(q, "[]byte("), ")"))
		require.NoError(t, err)
		f, err := New(Config{})
		require.NoError(t, err)
		require.NoError(t, f.Restore(strings.NewReader(q)))
		out := map[uint64]uint64{}
		f.cur.Load().caps.root().Walk(func(_ []byte, c *capab) bool {
			out[c.ino] = c.epoch - c.since
			return false
		})
		return out
	}
	require.Equal(t, map[uint64]uint64{2: 0, 3: 0, 4: 0}, sinces("caps-recalled"))
	require.Equal(t, map[uint64]uint64{2: 3, 3: 2, 4: 1}, sinces("caps-tenure"))

	capRecord := func(since uint64) []byte {
		var e enc
		e.uvarint(2).uvarint(1).uvarint(5).varint(0).uvarint(capExcl)
		if since != 0 {
			e.uvarint(since)
		}
		return e.b
	}
	tests := []struct {
		name  string
		since uint64 // 0: not written
		want  uint64
		err   string
	}{
		{"not written", 0, 5, ""},
		{"earlier", 3, 3, ""},
		{"the epoch", 5, 0, "tenure from 5"},
		{"later", 6, 0, "tenure from 6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := &restorer{s: newState(4096, nil)}
			err := rs.capab(&dec{b: capRecord(tc.since)})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			c, ok := rs.s.caps.get(pairKey(2, 1))
			require.True(t, ok)
			require.Equal(t, tc.want, c.since)
			require.True(t, c.excl)
		})
	}
}
