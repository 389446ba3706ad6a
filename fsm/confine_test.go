package fsm_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/proto"
)

func in(root string, c *pb.Command) *pb.Command {
	c.Root, c.Owner = root, "token:t"
	return c
}

func mkfile(p string, data []byte) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path(p), Data: data, Create: true, Mode: 0o644}}}
}

func stQ(root string, loc *pb.Loc) *pb.Query {
	return &pb.Query{Root: root, Owner: "token:t", Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: loc}}}
}

// TestConfinedLinksAcrossRestore: what a confined command may name by
// number depends on the directories naming each file, which the links
// index holds and a restore rebuilds; a restored replica answers every
// confined question as the one that applied the log.
func TestConfinedLinksAcrossRestore(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/a", 0o755))
	h.Must(ft.Mkdir("/out", 0o755))
	h.Must(mkfile("/out/both", []byte("x")))
	h.Must(ft.Link("/out/both", "/a/both")) // named inside and outside
	h.Must(mkfile("/out/gone", []byte("y")))
	h.Must(ft.Link("/out/gone", "/a/gone"))
	h.Must(ft.Unlink("/a/gone")) // named outside only now
	h.Must(mkfile("/a/moved", []byte("z")))
	h.Must(ft.Rename("/a/moved", "/out/moved")) // moved out
	h.Must(mkfile("/a/two", []byte("w")))
	h.Must(ft.Link("/a/two", "/a/two2"))
	h.Must(ft.Unlink("/a/two")) // still named inside by two2
	want := map[string]syscall.Errno{"/out/both": 0, "/out/gone": syscall.EACCES, "/out/moved": syscall.EACCES,
		"/a/two2": 0, "/out": syscall.EACCES, "/": syscall.EACCES}
	check := func(f *fsm.FSM) {
		for p, errno := range want {
			n := f.Query(ft.Lstat(p)).Attr.Ino
			if n == 1 {
				n = ino(t, h, "/a") // its number to a client confined to /a
			}
			r := f.Query(stQ("/a", &pb.Loc{Ino: n}))
			require.Equal(t, errno, errnoOf(r), "%s: %s", p, r.Message)
		}
		r := f.Query(stQ("/a", &pb.Loc{Path: "/../../out/both"}))
		require.Equal(t, syscall.ENOENT, errnoOf(r), "the path stays inside")
		r = f.Query(stQ("/a", &pb.Loc{Ino: 1}))
		require.Zero(t, r.Errno, r.Message)
		require.EqualValues(t, 1, r.Attr.Ino)
	}
	check(h.F)
	check(restored(t, snapBytes(t, h.F)))
}

// TestConfinedCommandsChangeNothingOutside: commands of a confined client
// that name something outside fail with EACCES and leave the state as it
// was; those inside work and report its numbering.
func TestConfinedCommandsChangeNothingOutside(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/a", 0o755))
	h.Must(ft.Mkdir("/out", 0o755))
	h.Must(mkfile("/out/f", []byte("x")))
	out, dir, a := ino(t, h, "/out/f"), ino(t, h, "/out"), ino(t, h, "/a")
	before := dump(t, h.F)
	for _, c := range []*pb.Command{
		ft.SetAttr(&pb.Loc{Ino: out}, &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_MODE), Mode: 0o777}),
		{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Parent: dir, Name: "f"}}}},
		{Op: &pb.Command_Link{Link: &pb.LinkCmd{Src: &pb.Loc{Ino: out}, Dst: &pb.Loc{Path: "/f"}}}},
		{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{Src: &pb.Loc{Ino: out}, Dst: &pb.Loc{Path: "/f"}}}},
		{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Ino: a}, Data: []byte("real root by its number")}}},
		{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Parent: a, Name: "d"}}}},
	} {
		r := h.Do(in("/a", c))
		require.Equal(t, syscall.EACCES, errnoOf(r), "%v: %s", c, r.Message)
	}
	require.Equal(t, before, dump(t, h.F), "refused commands changed the state")

	r := h.Must(in("/a", &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Parent: 1, Name: "d"}, Mode: 0o755}}}))
	d := r.Attr.Ino
	require.Equal(t, ino(t, h, "/a/d"), d)
	r = h.Must(in("/a", &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{
		Src: &pb.Loc{Path: "/d"}, Dst: &pb.Loc{Path: "/../e"}}}}))
	require.Equal(t, d, r.Attr.Ino)
	require.Equal(t, d, ino(t, h, "/a/e"), "renamed inside")
	r = h.Do(in("/a", ft.Rmdir("/")))
	require.Equal(t, syscall.EBUSY, errnoOf(r), r.Message)
	r = h.Do(in("/nowhere", ft.Mkdir("/x", 0o755)))
	require.Equal(t, syscall.ENOENT, errnoOf(r), r.Message)
	r = h.Do(in("relative", ft.Mkdir("/x", 0o755)))
	require.Equal(t, syscall.EINVAL, errnoOf(r), r.Message)
}

// TestConfinedTokens: a token carries its path through a snapshot; an
// admin token and an unclean path are refused.
func TestConfinedTokens(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	c := tokenCreate("confined", pb.Role_ROLE_WRITE, "c", 0)
	c.GetTokenCreate().Path = "/tenants/a"
	h.Must(c)
	for _, tc := range []struct {
		role pb.Role
		path string
	}{{pb.Role_ROLE_ADMIN, "/a"}, {pb.Role_ROLE_READ, "/a/../b"}, {pb.Role_ROLE_READ, "a"}, {pb.Role_ROLE_READ, "/"}, {pb.Role_ROLE_READ, "/a/"}} {
		c := tokenCreate("x"+tc.path, tc.role, "", 0)
		c.GetTokenCreate().Path = tc.path
		require.Equal(t, syscall.EINVAL, errnoOf(h.Do(c)), "%v %q", tc.role, tc.path)
	}
	snap := snapBytes(t, h.F)
	g := restored(t, snap)
	toks := g.Query(tokensQuery).Tokens
	require.Len(t, toks, 1)
	require.Equal(t, "/tenants/a", toks[0].Path)
	require.Equal(t, snap, snapBytes(t, g))
}
