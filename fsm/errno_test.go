package fsm_test

import (
	"strings"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// fixture builds the tree the errno tables run against:
//
//	/d/f ("data")  /d/sub/g  /e (empty)  /file ("x")
//	/l -> /d   /dangling -> /nope   /loop1 <-> /loop2
//
// and opens /file read-only as handle ro (in the harness's session).
func fixture(t *testing.T) (h *ft.Harness, ro uint64) {
	h = ft.New(t, fsm.Config{ChunkSize: 4096})
	h.OpenSession(60_000)
	for _, c := range []*pb.Command{ft.Mkdir("/d", 0o755), ft.Mkdir("/d/sub", 0o755), ft.Mkdir("/e", 0o700)} {
		h.Must(c)
	}
	for _, p := range []string{"/d/f", "/d/sub/g", "/file"} {
		r := h.Must(h.Sess(ft.Create(p)))
		h.Must(h.Sess(ft.Close(r.Handle)))
	}
	h.Must(ft.Write("/d/f", 0, []byte("data")))
	h.Must(ft.Write("/file", 0, []byte("x")))
	h.Must(ft.Symlink("/d", "/l"))
	h.Must(ft.Symlink("/nope", "/dangling"))
	h.Must(ft.Symlink("/loop2", "/loop1"))
	h.Must(ft.Symlink("/loop1", "/loop2"))
	h.Must(h.Sess(ft.SetXattr("/file", "user.a", []byte("1"), 0)))
	ro = h.Must(h.Sess(ft.Open("/file", ft.ORdonly, 0))).Handle
	return h, ro
}

func withLoc(c *pb.Command, loc *pb.Loc) *pb.Command {
	switch op := c.Op.(type) {
	case *pb.Command_Mkdir:
		op.Mkdir.Loc = loc
	case *pb.Command_Open:
		op.Open.Loc = loc
	case *pb.Command_Write:
		op.Write.Loc = loc
	}
	return c
}

func TestCommandErrnos(t *testing.T) {
	long := strings.Repeat("n", 256)
	type cmdFn func(h *ft.Harness, ro uint64) *pb.Command
	c := func(cmd *pb.Command) cmdFn { return func(*ft.Harness, uint64) *pb.Command { return cmd } }
	sess := func(cmd *pb.Command) cmdFn { return func(h *ft.Harness, _ uint64) *pb.Command { return h.Sess(cmd) } }
	tests := []struct {
		name string
		cmd  cmdFn
		want syscall.Errno
	}{
		{"mkdir existing", c(ft.Mkdir("/d", 0o755)), syscall.EEXIST},
		{"mkdir over symlink", c(ft.Mkdir("/dangling", 0o755)), syscall.EEXIST},
		{"mkdir root", c(ft.Mkdir("/", 0o755)), syscall.EEXIST},
		{"mkdir missing parent", c(ft.Mkdir("/nope/x", 0o755)), syscall.ENOENT},
		{"mkdir under file", c(ft.Mkdir("/file/x", 0o755)), syscall.ENOTDIR},
		{"mkdir dot", c(ft.Mkdir("/d/.", 0o755)), syscall.EINVAL},
		{"mkdir dotdot", c(ft.Mkdir("/d/..", 0o755)), syscall.EINVAL},
		{"mkdir name with slash", c(withLoc(ft.Mkdir("", 0), ft.At(1, "a/b"))), syscall.EINVAL},
		{"mkdir name with NUL", c(withLoc(ft.Mkdir("", 0), ft.At(1, "a\x00b"))), syscall.EINVAL},
		{"mkdir path with NUL", c(ft.Mkdir("/a\x00b", 0)), syscall.EINVAL},
		{"mkdir name too long", c(ft.Mkdir("/"+long, 0o755)), syscall.ENAMETOOLONG},
		{"mkdir parent+name too long", c(withLoc(ft.Mkdir("", 0), ft.At(1, long))), syscall.ENAMETOOLONG},
		{"mkdir path too long", c(ft.Mkdir(strings.Repeat("/d", 2049), 0o755)), syscall.ENAMETOOLONG},
		{"mkdir relative path", c(ft.Mkdir("d/x", 0o755)), syscall.EINVAL},
		{"mkdir by inode", c(withLoc(ft.Mkdir("", 0), ft.Ino(1))), syscall.EINVAL},
		{"mkdir no location", c(withLoc(ft.Mkdir("", 0), nil)), syscall.EINVAL},
		{"mkdir unknown parent", c(withLoc(ft.Mkdir("", 0), ft.At(999, "x"))), syscall.ENOENT},
		{"mkdir parent is a file", func(h *ft.Harness, _ uint64) *pb.Command {
			return withLoc(ft.Mkdir("", 0), ft.At(ino(t, h, "/file"), "x"))
		}, syscall.ENOTDIR},
		{"mkdir through symlink loop", c(ft.Mkdir("/loop1/x", 0o755)), syscall.ELOOP},

		{"remove missing", c(ft.Remove("/nope")), syscall.ENOENT},
		{"remove non-empty dir", c(ft.Remove("/d")), syscall.ENOTEMPTY},
		{"rmdir file", c(ft.Rmdir("/file")), syscall.ENOTDIR},
		{"unlink dir", c(ft.Unlink("/e")), syscall.EISDIR},
		{"remove root", c(ft.Remove("/")), syscall.EBUSY},
		{"remove dot", c(ft.Remove("/d/.")), syscall.EINVAL},
		{"remove dotdot", c(ft.Remove("/d/sub/..")), syscall.EINVAL},
		{"remove under file", c(ft.Remove("/file/x")), syscall.ENOTDIR},
		{"remove file with slash", c(ft.Remove("/file/")), syscall.ENOTDIR},
		{"remove both flags", c(&pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: ft.Path("/file"), DirOnly: true, FileOnly: true}}}), syscall.EINVAL},
		{"remove by inode", c(&pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: ft.Ino(2)}}}), syscall.EINVAL},

		{"rename missing", c(ft.Rename("/nope", "/x")), syscall.ENOENT},
		{"rename dir into itself", c(ft.Rename("/d", "/d/sub/x")), syscall.EINVAL},
		{"rename dir onto own child", c(ft.Rename("/d/sub", "/d/sub/g")), syscall.EINVAL},
		{"rename file over dir", c(ft.Rename("/file", "/e")), syscall.EISDIR},
		{"rename dir over file", c(ft.Rename("/e", "/file")), syscall.ENOTDIR},
		{"rename dir over non-empty dir", c(ft.Rename("/e", "/d")), syscall.ENOTEMPTY},
		{"rename into missing dir", c(ft.Rename("/file", "/nope/x")), syscall.ENOENT},
		{"rename root", c(ft.Rename("/", "/x")), syscall.EBUSY},
		{"rename onto root", c(ft.Rename("/file", "/")), syscall.EBUSY},
		{"rename onto dot", c(ft.Rename("/file", "/d/.")), syscall.EINVAL},
		{"rename noreplace", c(&pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{Src: ft.Path("/file"), Dst: ft.Path("/d/f"), Noreplace: true}}}), syscall.EEXIST},

		{"open without session", c(ft.Open("/file", ft.ORdonly, 0)), syscall.ESTALE},
		{"open missing", sess(ft.Open("/nope", ft.ORdonly, 0)), syscall.ENOENT},
		{"open dir for writing", sess(ft.Open("/d", ft.OWronly, 0)), syscall.EISDIR},
		{"open dir with O_CREAT", sess(ft.Open("/d", ft.OCreat|ft.ORdonly, 0)), syscall.EISDIR},
		{"open dir with O_TRUNC", sess(ft.Open("/d", ft.OTrunc, 0)), syscall.EISDIR},
		{"create exclusive existing", sess(ft.Open("/file", ft.OCreat|ft.OExcl|ft.ORdwr, 0)), syscall.EEXIST},
		{"create exclusive over dangling symlink", sess(ft.Open("/dangling", ft.OCreat|ft.OExcl|ft.ORdwr, 0)), syscall.EEXIST},
		{"open bad access mode", sess(ft.Open("/file", 3, 0)), syscall.EINVAL},
		{"open symlink loop", sess(ft.Open("/loop1", ft.ORdonly, 0)), syscall.ELOOP},
		{"open dangling symlink", sess(ft.Open("/dangling", ft.ORdonly, 0)), syscall.ENOENT},
		{"open symlink with O_NOFOLLOW", sess(ft.Open("/l", ft.ORdonly|0x20000, 0)), syscall.ELOOP},
		{"open file with O_DIRECTORY", sess(ft.Open("/file", ft.ORdonly|0x10000, 0)), syscall.ENOTDIR},
		{"open file with slash", sess(ft.Open("/file/", ft.ORdonly, 0)), syscall.ENOTDIR},
		{"create with slash", sess(ft.Open("/new/", ft.OCreat|ft.ORdwr, 0)), syscall.EISDIR},
		{"create in missing dir", sess(ft.Open("/nope/f", ft.OCreat|ft.ORdwr, 0)), syscall.ENOENT},
		{"create named dot", sess(ft.Open("/d/.", ft.OCreat|ft.ORdwr, 0)), syscall.EISDIR},
		{"open unknown session", c(&pb.Command{Session: 77, Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: ft.Path("/file")}}}), syscall.ESTALE},
		{"close unknown handle", sess(ft.Close(999)), syscall.EBADF},
		{"close without session", func(_ *ft.Harness, ro uint64) *pb.Command { return ft.Close(ro) }, syscall.EBADF},

		{"write dir", c(ft.Write("/d", 0, []byte("x"))), syscall.EISDIR},
		{"write through symlink to dir", c(ft.Write("/l", 0, []byte("x"))), syscall.EISDIR},
		{"write symlink itself", c(withLoc(ft.Write("", 0, []byte("x")), ft.Lpath("/dangling"))), syscall.EINVAL},
		{"write missing", c(ft.Write("/nope", 0, []byte("x"))), syscall.ENOENT},
		{"write negative offset", c(ft.Write("/file", -1, []byte("x"))), syscall.EINVAL},
		{"write past max size", c(ft.Write("/file", 1<<40, []byte("x"))), syscall.EFBIG},
		{"write too large", c(ft.Write("/file", 0, make([]byte, 64<<20+1))), syscall.EFBIG},
		{"write unknown handle", sess(ft.WriteH(999, 0, []byte("x"))), syscall.EBADF},
		{"write read-only handle", func(h *ft.Harness, ro uint64) *pb.Command { return h.Sess(ft.WriteH(ro, 0, []byte("x"))) }, syscall.EBADF},
		{"write handle of other session", func(_ *ft.Harness, ro uint64) *pb.Command { return ft.WriteH(ro, 0, []byte("x")) }, syscall.EBADF},

		{"truncate dir", c(ft.Truncate("/d", 0)), syscall.EISDIR},
		{"truncate negative", c(ft.Truncate("/file", -1)), syscall.EINVAL},
		{"truncate past max", c(ft.Truncate("/file", 1<<40+1)), syscall.EFBIG},
		{"truncate symlink", c(ft.SetAttr(ft.Lpath("/l"), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_SIZE)})), syscall.EINVAL},
		{"truncate read-only handle", func(h *ft.Harness, ro uint64) *pb.Command {
			return h.Sess(ft.SetAttr(nil, &pb.SetAttrCmd{Handle: ro, Valid: uint32(pb.SetAttrBit_SET_SIZE)}))
		}, syscall.EINVAL},
		{"setattr unknown bit", c(ft.SetAttr(ft.Path("/file"), &pb.SetAttrCmd{Valid: 1024})), syscall.EINVAL},
		{"setattr access with another bit", c(ft.SetAttr(ft.Path("/file"), &pb.SetAttrCmd{Valid: 256 | 1})), syscall.EINVAL},
		{"setattr missing", c(ft.Chmod("/nope", 0o600)), syscall.ENOENT},

		{"symlink empty target", c(ft.Symlink("", "/s")), syscall.ENOENT},
		{"symlink target too long", c(ft.Symlink(strings.Repeat("t", 4097), "/s")), syscall.ENAMETOOLONG},
		{"symlink target with NUL", c(ft.Symlink("a\x00b", "/s")), syscall.EINVAL},
		{"symlink existing", c(ft.Symlink("/x", "/file")), syscall.EEXIST},

		{"link dir", c(ft.Link("/d", "/x")), syscall.EPERM},
		{"link missing", c(ft.Link("/nope", "/x")), syscall.ENOENT},
		{"link onto existing", c(ft.Link("/file", "/d/f")), syscall.EEXIST},
		{"link into missing dir", c(ft.Link("/file", "/nope/x")), syscall.ENOENT},

		{"setxattr empty name", c(ft.SetXattr("/file", "", nil, 0)), syscall.ERANGE},
		{"setxattr long name", c(ft.SetXattr("/file", long, nil, 0)), syscall.ERANGE},
		{"setxattr big value", c(ft.SetXattr("/file", "user.b", make([]byte, 64<<10+1), 0)), syscall.E2BIG},
		{"setxattr bad flags", c(ft.SetXattr("/file", "user.b", nil, 3)), syscall.EINVAL},
		{"setxattr create existing", c(ft.SetXattr("/file", "user.a", nil, 1)), syscall.EEXIST},
		{"setxattr replace missing", c(ft.SetXattr("/file", "user.b", nil, 2)), syscall.ENODATA},
		{"setxattr missing file", c(ft.SetXattr("/nope", "user.b", nil, 0)), syscall.ENOENT},
		{"removexattr missing", c(ft.RemoveXattr("/file", "user.b")), syscall.ENODATA},

		{"clone dir without recursive", c(ft.Clone("/d", "/x", false)), syscall.EISDIR},
		{"clone dir into itself", c(ft.Clone("/d", "/d/sub/x", true)), syscall.EINVAL},
		{"clone onto existing", c(ft.Clone("/file", "/d/f", false)), syscall.EEXIST},
		{"clone missing", c(ft.Clone("/nope", "/x", false)), syscall.ENOENT},

		{"keep_alive without session", c(ft.KeepAlive()), syscall.ESTALE},
		{"close_session without session", c(ft.CloseSession()), syscall.ESTALE},
		{"keep_alive unknown session", c(&pb.Command{Session: 99, Op: &pb.Command_KeepAlive{}}), syscall.ESTALE},
		{"open_session negative lease", c(ft.OpenSession(-1)), syscall.EINVAL},
		{"command without op", c(&pb.Command{}), syscall.EINVAL},
		{"nil command", c(nil), syscall.EINVAL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, ro := fixture(t)
			before := dump(t, h.F)
			r := h.Apply(tc.cmd(h, ro))[0]
			require.Equal(t, tc.want, errnoOf(r), "message %q", r.Message)
			require.NotEmpty(t, r.Message)
			err := fsm.ResultError(r)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, before, dump(t, h.F), "a failed command changed the tree")
		})
	}
}

func TestQueryErrnos(t *testing.T) {
	q := func(loc *pb.Loc) *pb.Query { return ft.StatLoc(loc) }
	tests := []struct {
		name  string
		query func(h *ft.Harness, ro uint64) *pb.Query
		want  syscall.Errno
	}{
		{"stat missing", func(*ft.Harness, uint64) *pb.Query { return ft.Stat("/nope") }, syscall.ENOENT},
		{"stat under file", func(*ft.Harness, uint64) *pb.Query { return ft.Stat("/file/x") }, syscall.ENOTDIR},
		{"stat loop", func(*ft.Harness, uint64) *pb.Query { return ft.Stat("/loop1") }, syscall.ELOOP},
		{"lstat loop", func(*ft.Harness, uint64) *pb.Query { return ft.Lstat("/loop1") }, 0},
		{"stat dangling", func(*ft.Harness, uint64) *pb.Query { return ft.Stat("/dangling") }, syscall.ENOENT},
		{"stat unknown inode", func(*ft.Harness, uint64) *pb.Query { return q(ft.Ino(999)) }, syscall.ENOENT},
		{"lookup by parent and name", func(*ft.Harness, uint64) *pb.Query { return q(ft.At(1, "file")) }, 0},
		{"lookup dotdot", func(*ft.Harness, uint64) *pb.Query { return ft.Stat("/d/sub/../../d/f") }, 0},
		{"stat empty location", func(*ft.Harness, uint64) *pb.Query { return q(&pb.Loc{}) }, syscall.EINVAL},
		{"read dir", func(*ft.Harness, uint64) *pb.Query { return ft.Read("/d", 0, 1) }, syscall.EISDIR},
		{"read through symlink to dir", func(*ft.Harness, uint64) *pb.Query { return ft.Read("/l", 0, 1) }, syscall.EISDIR},
		{"read negative offset", func(*ft.Harness, uint64) *pb.Query { return ft.Read("/file", -1, 1) }, syscall.EINVAL},
		{"read negative length", func(*ft.Harness, uint64) *pb.Query { return ft.Read("/file", 0, -1) }, syscall.EINVAL},
		{"read unknown handle", func(*ft.Harness, uint64) *pb.Query { return ft.ReadH(999, 0, 1) }, syscall.EBADF},
		{"read handle", func(_ *ft.Harness, ro uint64) *pb.Query { return ft.ReadH(ro, 0, 1) }, 0},
		{"readdir file", func(*ft.Harness, uint64) *pb.Query { return ft.ReadDir("/file", "", 0) }, syscall.ENOTDIR},
		{"readlink file", func(*ft.Harness, uint64) *pb.Query { return ft.Readlink("/file") }, syscall.EINVAL},
		{"readlink symlink", func(*ft.Harness, uint64) *pb.Query { return ft.Readlink("/l") }, 0},
		{"getxattr missing", func(*ft.Harness, uint64) *pb.Query { return ft.GetXattr("/file", "user.b") }, syscall.ENODATA},
		{"getxattr empty name", func(*ft.Harness, uint64) *pb.Query { return ft.GetXattr("/file", "") }, syscall.ERANGE},
		{"handle unknown", func(h *ft.Harness, _ uint64) *pb.Query { return ft.HandleStatus(h.Session, 999) }, syscall.EBADF},
		{"handle of other session", func(h *ft.Harness, ro uint64) *pb.Query { return ft.HandleStatus(h.Session+1, ro) }, syscall.EBADF},
		{"usage missing", func(*ft.Harness, uint64) *pb.Query { return ft.Usage("/nope") }, syscall.ENOENT},
		{"empty query", func(*ft.Harness, uint64) *pb.Query { return &pb.Query{} }, syscall.EINVAL},
		{"nil query", func(*ft.Harness, uint64) *pb.Query { return nil }, syscall.EINVAL},
	}
	h, ro := fixture(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := h.Q(tc.query(h, ro))
			require.Equal(t, tc.want, errnoOf(r), "message %q", r.Message)
		})
	}
}
