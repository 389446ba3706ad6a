package fsm_test

import (
	"maps"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
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
	g := restored(t, snapBytes(t, h.F))
	check(g)
	require.NoError(t, h.F.CheckNames())
	require.NoError(t, g.CheckNames())
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

// TestConfinedHardLinks: a file is inside while any of its names is.
// Renames, unlinks and clones of hard-linked files move it in and out; at
// every step a replica restored from a snapshot, and one restored at the
// start that applied the log since, answer every confined question as the
// one that applied the whole log, and each holds where every file is
// named as its entries say.
func TestConfinedHardLinks(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	for _, d := range []string{"/a", "/a/sub", "/out", "/src", "/src/sub"} {
		h.Must(ft.Mkdir(d, 0o755))
	}
	for _, l := range [][2]string{{"/a/r", "/out/r"}, {"/a/u", "/out/u"}, {"/a/v", "/out/v"}, {"/a/s", "/a/s2"},
		{"/src/x", "/src/sub/y"}, {"/src/z", "/out/z"}} {
		h.Must(mkfile(l[0], []byte(l[0])))
		h.Must(ft.Link(l[0], l[1]))
	}
	follower := restored(t, snapBytes(t, h.F))
	inos := map[string]uint64{}
	label := func(name, p string) { inos[name] = ino(t, h, p) }
	for _, name := range []string{"r", "u", "v", "s"} {
		label(name, "/a/"+name)
	}
	label("x", "/src/x")
	label("z", "/src/z")

	steps := []struct {
		name   string
		cmds   []*pb.Command
		labels map[string]string // label -> path, taken after cmds
		want   map[string]syscall.Errno
	}{
		{name: "named inside and outside",
			want: map[string]syscall.Errno{"r": 0, "u": 0, "v": 0, "s": 0, "x": syscall.EACCES, "z": syscall.EACCES}},
		{name: "rename the inside name out", cmds: []*pb.Command{ft.Rename("/a/r", "/out/r2")},
			want: map[string]syscall.Errno{"r": syscall.EACCES}},
		{name: "rename the outside name in", cmds: []*pb.Command{ft.Rename("/out/r", "/a/sub/r3")},
			want: map[string]syscall.Errno{"r": 0}},
		{name: "rename inside one directory", cmds: []*pb.Command{ft.Rename("/a/sub/r3", "/a/sub/r4")},
			want: map[string]syscall.Errno{"r": 0}},
		{name: "rename onto its other name", cmds: []*pb.Command{ft.Rename("/out/r2", "/a/sub/r4")},
			want: map[string]syscall.Errno{"r": 0}},
		{name: "unlink the inside one of two names", cmds: []*pb.Command{ft.Unlink("/a/u")},
			want: map[string]syscall.Errno{"u": syscall.EACCES}},
		{name: "unlink the outside one of two names", cmds: []*pb.Command{ft.Unlink("/out/v")},
			want: map[string]syscall.Errno{"v": 0}},
		{name: "unlink one of two names in one directory", cmds: []*pb.Command{ft.Unlink("/a/s")},
			want: map[string]syscall.Errno{"s": 0}},
		{name: "then move the other out", cmds: []*pb.Command{ft.Rename("/a/s2", "/out/s2")},
			want: map[string]syscall.Errno{"s": syscall.EACCES}},
		{name: "clone a tree with hard links in", cmds: []*pb.Command{ft.Clone("/src", "/a/copy", true)},
			labels: map[string]string{"cx": "/a/copy/x", "cy": "/a/copy/sub/y", "cz": "/a/copy/z"},
			want:   map[string]syscall.Errno{"cx": 0, "cz": 0, "x": syscall.EACCES, "z": syscall.EACCES}},
		{name: "clone it outside", cmds: []*pb.Command{ft.Clone("/src", "/out/copy", true)},
			labels: map[string]string{"ox": "/out/copy/x", "oz": "/out/copy/z"},
			want:   map[string]syscall.Errno{"ox": syscall.EACCES, "oz": syscall.EACCES, "cx": 0}},
		{name: "move one name of the cloned link out", cmds: []*pb.Command{ft.Rename("/a/copy/x", "/out/cx")},
			want: map[string]syscall.Errno{"cx": 0}},
		{name: "unlink its last name inside", cmds: []*pb.Command{ft.Unlink("/a/copy/sub/y")},
			want: map[string]syscall.Errno{"cx": syscall.EACCES}},
		{name: "link it back in, twice, and a clone of an outside one", cmds: []*pb.Command{
			ft.Link("/out/cx", "/a/cx"), ft.Link("/out/cx", "/a/sub/cx"), ft.Unlink("/a/cx"), ft.Link("/out/copy/x", "/a/ox")},
			want: map[string]syscall.Errno{"cx": 0, "ox": 0, "oz": syscall.EACCES}},
	}
	want := map[string]syscall.Errno{}
	for _, st := range steps {
		for _, c := range st.cmds {
			e := ft.Entry(h.Time, c)
			h.Index++
			h.Time += int64(h.Step)
			r := h.F.Apply(h.Index, e)[0]
			require.Zero(t, r.Errno, "%s: %v: %s", st.name, c, r.Message)
			follower.Apply(h.Index, e)
		}
		for name, p := range st.labels {
			label(name, p)
		}
		maps.Copy(want, st.want)
		if st.labels["cx"] != "" {
			require.Equal(t, inos["cx"], inos["cy"], "the clone keeps the hard link")
			require.NotEqual(t, inos["z"], inos["cz"])
		}
		snap := snapBytes(t, h.F)
		require.Equal(t, snap, snapBytes(t, follower), st.name)
		for which, f := range map[string]*fsm.FSM{"log": h.F, "follower": follower, "restored": restored(t, snap)} {
			require.NoError(t, f.CheckNames(), "%s: %s", st.name, which)
			for name, errno := range want {
				r := f.Query(stQ("/a", &pb.Loc{Ino: inos[name]}))
				require.Equal(t, errno, errnoOf(r), "%s: %s: %s: %s", st.name, which, name, r.Message)
			}
		}
	}
}
