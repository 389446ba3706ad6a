package fsm_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func TestSessionOwner(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	open := func(owner string) uint64 {
		r := h.Must(&pb.Command{Owner: owner, Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 60_000}}})
		return r.Session
	}
	mine, anyone := open("cert:alice"), open("")
	h.Must(&pb.Command{Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: 4}}, Session: anyone, Seq: 1})
	cmd := func(owner string, sess, seq uint64, path string) *pb.Command {
		c := ft.Mkdir(path, 0o755)
		c.Owner, c.Session, c.Seq = owner, sess, seq
		return c
	}
	cases := []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"owner", cmd("cert:alice", mine, 1, "/a"), 0},
		{"owner's retry", cmd("cert:alice", mine, 1, "/a"), 0},
		{"another owner replays", cmd("cert:mallory", mine, 1, "/a"), syscall.EPERM},
		{"another owner, new seq", cmd("cert:mallory", mine, 2, "/m"), syscall.EPERM},
		{"no owner in an owned session", cmd("", mine, 3, "/m"), syscall.EPERM},
		{"an owner in an unowned session", cmd("cert:alice", anyone, 2, "/m"), syscall.EPERM},
		{"unowned session, unowned command", cmd("", anyone, 3, "/b"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.Do(tc.cmd)
			require.Equal(t, uint32(tc.want), r.Errno, r.Message)
		})
	}
	require.Equal(t, uint32(syscall.ENOENT), h.F.Query(ft.StatLoc(ft.Path("/m"))).Errno, "no refused command changed the tree")

	// The owner survives a snapshot, which writes back the same bytes.
	snap := snapBytes(t, h.F)
	g := restored(t, snap)
	require.Equal(t, snap, snapBytes(t, g))
	r := g.Apply(100, ft.Entry(ft.Start+int64(1e9), cmd("cert:mallory", mine, 4, "/m")))
	require.Equal(t, uint32(syscall.EPERM), r[0].Errno)

	if os.Getenv("MEMFS_WRITE_SEEDS") != "" {
		writeSeed(t, "FuzzRestore", "session-owner", snap)
	}
}

func TestSessionsPerOwner(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	open := func(owner string) *pb.Result {
		return h.Do(&pb.Command{Owner: owner, Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 60_000}}})
	}
	var first uint64
	for i := range 1024 {
		r := open("token:greedy")
		require.Zero(t, r.Errno, r.Message)
		if i == 0 {
			first = r.Session
		}
	}
	r := open("token:greedy")
	require.Equal(t, uint32(syscall.EUSERS), r.Errno, r.Message)
	require.Zero(t, open("token:other").Errno, "other identities are not held back")
	require.Zero(t, open("").Errno, "unidentified clients (no TLS) have no bound")
	h.Must(&pb.Command{Owner: "token:greedy", Session: first, Seq: 1, Op: &pb.Command_CloseSession{CloseSession: &pb.CloseSessionCmd{}}})
	require.Zero(t, open("token:greedy").Errno, "a closed session frees its place")
}

func TestHandlesPerSession(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Session = h.OpenSession(600_000)
	h.Must(h.Sess(ft.Create("/f")))
	var first uint64
	opened := 1 // the create's handle
	for opened < 1<<16 {
		var cmds []*pb.Command
		for range min(4096, 1<<16-opened) {
			cmds = append(cmds, h.Sess(ft.Open("/f", ft.ORdonly, 0)))
		}
		for _, r := range h.Apply(cmds...) {
			require.Zero(t, r.Errno, r.Message)
			if first == 0 {
				first = r.Handle
			}
			opened++
		}
	}
	r := h.Do(h.Sess(ft.Open("/f", ft.ORdonly, 0)))
	require.Equal(t, uint32(syscall.EMFILE), r.Errno, r.Message)
	// The count is derived: a restored state knows it too.
	g := restored(t, snapBytes(t, h.F))
	res := g.Apply(h.Index+1, ft.Entry(h.Time, h.Sess(ft.Open("/f", ft.ORdonly, 0))))
	require.Equal(t, uint32(syscall.EMFILE), res[0].Errno)
	h.Must(h.Sess(ft.Close(first)))
	require.Zero(t, h.Do(h.Sess(ft.Open("/f", ft.ORdonly, 0))).Errno, "a closed handle frees its place")
}
