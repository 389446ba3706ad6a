package fsm_test

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func TestRootAndAttrs(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	root := h.MustQ(ft.Stat("/")).Attr
	require.Equal(t, &pb.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Xattrs: proto.Uint32(0)}, root)
	h.Must(&pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/d"), Mode: 0o1777 | syscall.S_IFREG, Uid: 5, Gid: 6}}})
	d := h.MustQ(ft.Stat("/d")).Attr
	require.Equal(t, uint32(syscall.S_IFDIR|0o1777), d.Mode, "type bits come from the operation")
	require.Equal(t, uint32(5), d.Uid)
	require.Equal(t, uint32(6), d.Gid)
	require.Equal(t, uint64(h.Index), d.Generation)
	require.Equal(t, ft.Start, d.MtimeNs)
	root = h.MustQ(ft.Stat("/")).Attr
	require.Equal(t, uint32(3), root.Nlink)
	require.Equal(t, ft.Start, root.MtimeNs, "the parent's mtime moves with its entries")
	require.Equal(t, d, h.MustQ(ft.StatLoc(ft.At(1, "d"))).Attr, "lookup is stat by parent and name")
}

func TestSetAttr(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(ft.Symlink("/x", "/l"))
	h.OpenSession(60_000)
	r := h.Must(h.Sess(ft.Create("/f")))
	h.Advance(time.Second)
	a := h.Must(ft.SetAttr(ft.Path("/f"), &pb.SetAttrCmd{
		Valid: uint32(pb.SetAttrBit_SET_MODE | pb.SetAttrBit_SET_UID | pb.SetAttrBit_SET_GID | pb.SetAttrBit_SET_ATIME | pb.SetAttrBit_SET_MTIME),
		Mode:  0o4600 | syscall.S_IFDIR, Uid: 7, Gid: 8, AtimeNs: 11, MtimeNs: 22,
	})).Attr
	require.Equal(t, uint32(syscall.S_IFREG|0o4600), a.Mode)
	require.Equal(t, []any{uint32(7), uint32(8), int64(11), int64(22)}, []any{a.Uid, a.Gid, a.AtimeNs, a.MtimeNs})
	require.Equal(t, h.Time-int64(h.Step), a.CtimeNs)
	now := h.Time
	a = h.Must(ft.SetAttr(ft.Path("/f"), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_ATIME_NOW | pb.SetAttrBit_SET_MTIME_NOW | pb.SetAttrBit_SET_ATIME), AtimeNs: 5})).Attr
	require.Equal(t, now, a.AtimeNs, "_NOW wins and uses the entry's time")
	require.Equal(t, now, a.MtimeNs)
	// ftruncate through a handle; lchown on a symlink.
	a = h.Must(h.Sess(ft.SetAttr(nil, &pb.SetAttrCmd{Handle: r.Handle, Valid: uint32(pb.SetAttrBit_SET_SIZE), Size: 100}))).Attr
	require.Equal(t, uint64(100), a.Size)
	l := h.Must(ft.SetAttr(ft.Lpath("/l"), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_UID), Uid: 9})).Attr
	require.Equal(t, uint32(9), l.Uid)
	require.Equal(t, uint32(syscall.S_IFLNK|0o777), l.Mode)
	// valid == 0 changes nothing, not even ctime.
	before := h.MustQ(ft.Stat("/f")).Attr
	require.Equal(t, before, h.Must(ft.SetAttr(ft.Path("/f"), &pb.SetAttrCmd{})).Attr)
}

func TestRenameUpdatesLinks(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/a", 0o755))
	h.Must(ft.Mkdir("/b", 0o755))
	h.Must(ft.Mkdir("/a/sub", 0o755))
	h.Must(ft.Mkdir("/b/old", 0o755))
	sub := ino(t, h, "/a/sub")
	h.Must(ft.Rename("/a/sub", "/b/old"))
	require.Equal(t, uint32(2), h.MustQ(ft.Stat("/a")).Attr.Nlink)
	require.Equal(t, uint32(3), h.MustQ(ft.Stat("/b")).Attr.Nlink)
	require.Equal(t, sub, ino(t, h, "/b/old"))
	require.Equal(t, ino(t, h, "/b"), ino(t, h, "/b/old/.."), "'..' follows the move")
	require.Equal(t, uint64(4), h.F.Stats().Inodes, "the replaced directory is gone")
	// Symlinks resolve relative to their own directory.
	h.Must(ft.Symlink("../../a", "/b/old/up"))
	require.Equal(t, ino(t, h, "/a"), h.MustQ(ft.Stat("/b/old/up")).Attr.Ino)
	h.Must(ft.Mkdir("/b/old/up/x", 0o755))
	require.Equal(t, uint32(3), h.MustQ(ft.Stat("/a")).Attr.Nlink)
}

func TestReadDirPaging(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/d", 0o755))
	var want []string
	for i := range 50 {
		name := fmt.Sprintf("n%03d", (i*37)%50)
		h.Must(ft.Mkdir("/d/"+name, 0o755))
		want = append(want, fmt.Sprintf("n%03d", i))
	}
	h.Must(ft.Symlink("x", "/d/zlink"))
	want = append(want, "zlink")
	var got []string
	for _, e := range readAll(t, h.F, ino(t, h, "/d")) {
		got = append(got, e.Name)
	}
	require.Equal(t, want, got, "sorted by name, '.' and '..' left out")
	r := h.MustQ(ft.ReadDir("/d", "n048", 0))
	require.Equal(t, 2, len(r.Entries))
	require.True(t, r.Eof)
	require.Equal(t, "zlink", r.Cookie)
	require.Equal(t, uint32(syscall.S_IFLNK), r.Entries[1].Mode)
	r = h.MustQ(ft.ReadDir("/d", "n0485", 1))
	require.Equal(t, "n049", r.Entries[0].Name, "a cookie need not be a present name")
	require.False(t, r.Eof)
	r = h.MustQ(ft.ReadDir("/d", "zlink", 0))
	require.Empty(t, r.Entries)
	require.True(t, r.Eof)
	require.Equal(t, ino(t, h, "/d"), r.Attr.GetIno(), "a listing names the directory it listed")
}

// TestReadDirPlus checks that a listing asked with plus carries every
// entry's attributes, equal to what stat reports, in pages of at most
// 1024, and that one asked without carries none.
func TestReadDirPlus(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/d", 0o755))
	for i := range 1100 {
		h.Must(ft.Mkdir(fmt.Sprintf("/d/n%04d", i), uint32(0o700+i%8)))
	}
	d := ino(t, h, "/d")
	plus := h.MustQ(&pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: ft.Ino(d), Plus: true}}})
	require.Len(t, plus.Entries, 1024, "a plus page holds at most 1024 entries")
	require.False(t, plus.Eof)
	for _, e := range plus.Entries[:20] {
		require.NotNil(t, e.Attr, e.Name)
		require.True(t, proto.Equal(h.MustQ(ft.Lstat("/d/"+e.Name)).Attr, e.Attr), e.Name)
	}
	plain := h.MustQ(&pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: ft.Ino(d)}}})
	require.Len(t, plain.Entries, 1024)
	for _, e := range plain.Entries {
		require.Nil(t, e.Attr, e.Name)
	}
}

func TestXattrs(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(ft.SetXattr("/d", "user.b", []byte("2"), 0))
	h.Must(ft.SetXattr("/d", "user.a", []byte("1"), 1))
	h.Must(ft.SetXattr("/d", "user.b", []byte("22"), 2))
	h.Must(ft.SetXattr("/d", "user.e", nil, 0))
	require.Equal(t, []string{"user.a", "user.b", "user.e"}, h.MustQ(ft.ListXattr("/d")).Names)
	require.Equal(t, uint32(3), h.MustQ(ft.Stat("/d")).Attr.GetXattrs(), "attributes count the xattrs")
	require.Equal(t, []byte("22"), h.MustQ(ft.GetXattr("/d", "user.b")).Data)
	require.Empty(t, h.MustQ(ft.GetXattr("/d", "user.e")).Data)
	h.Must(ft.RemoveXattr("/d", "user.a"))
	require.Equal(t, []string{"user.b", "user.e"}, h.MustQ(ft.ListXattr("/d")).Names)
	// The total per inode is bounded.
	big := make([]byte, 64<<10)
	var last *pb.Result
	for i := range 20 {
		if last = h.Do(ft.SetXattr("/d", fmt.Sprintf("user.big%d", i), big, 0)); last.Errno != 0 {
			break
		}
	}
	require.Equal(t, syscall.ENOSPC, errnoOf(last))
}

func TestOnChange(t *testing.T) {
	var events []*pb.WatchEvent
	h := ft.New(t, fsm.Config{OnChange: func(e *pb.WatchEvent) { events = append(events, e) }})
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(ft.Rename("/d", "/e"))
	h.Must(ft.Tick())
	require.Len(t, events, 3)
	require.Equal(t, uint64(1), events[0].Index)
	require.Equal(t, []uint64{1, 2}, events[0].Inodes)
	require.Equal(t, []*pb.Dirent{{Ino: 1, Name: "d"}}, stripDirents(events[0].Entries))
	require.Equal(t, []*pb.Dirent{{Ino: 1, Name: "d"}, {Ino: 1, Name: "e"}}, stripDirents(events[1].Entries))
	require.Empty(t, events[2].Inodes)
	require.Empty(t, events[2].Entries)

	// Opening and closing change nothing a client sees; a write does.
	s := h.OpenSession(10_000)
	r := h.Must(inSession(s, 0, ft.Create("/f")))
	f := r.Attr.Ino
	events = nil
	h.Must(inSession(s, 0, ft.Open("/f", ft.ORdonly, 0)))
	h.Must(inSession(s, 0, ft.WriteH(r.Handle, 0, []byte("x"))))
	h.Must(inSession(s, 0, ft.Close(r.Handle)))
	require.Empty(t, events[0].Inodes)
	require.Equal(t, []uint64{f}, events[1].Inodes)
	require.Empty(t, events[2].Inodes)
}

func stripDirents(ds []*pb.Dirent) []*pb.Dirent {
	var out []*pb.Dirent
	for _, d := range ds {
		out = append(out, &pb.Dirent{Ino: d.Ino, Name: d.Name})
	}
	return out
}

func TestApplyBytes(t *testing.T) {
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	res, err := f.ApplyBytes(1, ft.Marshal(ft.Entry(1, ft.Mkdir("/a", 0o755), &pb.Command{})))
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Zero(t, res[0].Errno)
	require.Equal(t, uint32(syscall.EINVAL), res[1].Errno)

	before := dump(t, f)
	_, err = f.ApplyBytes(2, []byte{0xff, 0xff, 0xff})
	require.ErrorIs(t, err, syscall.EINVAL)
	_, err = f.ApplyBytes(3, ft.Marshal(&pb.Entry{Version: 99, Commands: []*pb.Command{ft.Mkdir("/b", 0o755)}}))
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Equal(t, before, dump(t, f))
	require.Equal(t, uint64(3), f.AppliedIndex(), "a refused entry still counts as applied")
	res = f.Apply(4, &pb.Entry{Commands: []*pb.Command{ft.Mkdir("/b", 0o755)}})
	require.Equal(t, uint32(syscall.EINVAL), res[0].Errno, "version 0 is unknown")
	require.Empty(t, f.Apply(5, nil))
	require.Equal(t, before, dump(t, f))
}

func TestWaitAppliedAndChanged(t *testing.T) {
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	ch := f.Changed()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, f.WaitApplied(ctx, 1), context.DeadlineExceeded)
	done := make(chan error)
	go func() { done <- f.WaitApplied(context.Background(), 2) }()
	f.Apply(1, ft.Entry(1, ft.Tick()))
	select {
	case <-ch:
	default:
		t.Fatal("Changed was not closed by an apply")
	}
	f.Apply(2, ft.Entry(2, ft.Tick()))
	require.NoError(t, <-done)
	require.NoError(t, f.WaitApplied(context.Background(), 1))
}

// TestSetgidDirectory: what is made in a set-group-ID directory takes its
// group, a directory the bit too; elsewhere the creator's group.
func TestSetgidDirectory(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	h.Must(&pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/g"), Mode: 0o2775, Uid: 1, Gid: 4321}}})
	h.Must(&pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/plain"), Mode: 0o755, Uid: 1, Gid: 1}}})
	h.OpenSession(60_000)
	cases := []struct {
		name     string
		cmd      *pb.Command
		wantMode uint32
		wantGid  uint32
	}{
		{"dir", &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/g/d"), Mode: 0o755, Uid: 2, Gid: 7}}}, syscall.S_IFDIR | 0o2755, 4321},
		{"dir in dir", &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/g/d/e"), Mode: 0o700, Uid: 2, Gid: 7}}}, syscall.S_IFDIR | 0o2700, 4321},
		{"file by open", h.Sess(&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: ft.Path("/g/f"), Flags: ft.OCreat | ft.ORdwr, Mode: 0o644, Uid: 2, Gid: 7}}}), syscall.S_IFREG | 0o644, 4321},
		{"file keeps its own bits", h.Sess(&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: ft.Path("/g/x"), Flags: ft.OCreat | ft.ORdwr, Mode: 0o2755, Uid: 2, Gid: 7}}}), syscall.S_IFREG | 0o2755, 4321},
		{"symlink", &pb.Command{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{Loc: ft.Path("/g/l"), Target: "f", Uid: 2, Gid: 7}}}, syscall.S_IFLNK | 0o777, 4321},
		{"outside", &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: ft.Path("/plain/d"), Mode: 0o755, Uid: 2, Gid: 7}}}, syscall.S_IFDIR | 0o755, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := h.Must(tc.cmd).GetAttr()
			require.Equal(t, tc.wantMode, a.GetMode(), "mode %o", a.GetMode())
			require.Equal(t, tc.wantGid, a.GetGid())
		})
	}
}

// TestAccessTimeRelatime: an access moves atime only when it is not
// later than mtime or ctime or is a day old, and never moves ctime.
func TestAccessTimeRelatime(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	access := ft.SetAttr(ft.Path("/f"), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_ATIME_READ)})
	h.Must(put("/f", "x"))
	attr := func() *pb.Attr { return h.MustQ(ft.Stat("/f")).GetAttr() }
	steps := []struct {
		name  string
		do    func()
		moves bool
	}{
		{"first access after the create", func() {}, true},
		{"again, nothing changed", func() {}, false},
		{"after a write", func() { h.Must(ft.Write("/f", 0, []byte("y"))) }, true},
		{"after a chmod", func() { h.Must(ft.Chmod("/f", 0o600)) }, true},
		{"an hour later", func() { h.Advance(time.Hour) }, false},
		{"a day later", func() { h.Advance(24 * time.Hour) }, true},
	}
	for _, s := range steps {
		h.Advance(time.Second)
		s.do()
		before := attr()
		after := h.Must(access).GetAttr()
		require.Equal(t, before.GetCtimeNs(), after.GetCtimeNs(), s.name)
		require.Equal(t, before.GetMtimeNs(), after.GetMtimeNs(), s.name)
		if s.moves {
			require.Greater(t, after.GetAtimeNs(), max(before.GetAtimeNs(), before.GetMtimeNs(), before.GetCtimeNs()), s.name)
		} else {
			require.Equal(t, before.GetAtimeNs(), after.GetAtimeNs(), s.name)
		}
		require.Equal(t, after.GetAtimeNs(), attr().GetAtimeNs(), s.name)
	}
	// Only alone.
	r := h.Do(ft.SetAttr(ft.Path("/f"), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_ATIME_READ | pb.SetAttrBit_SET_MODE)}))
	require.Equal(t, syscall.EINVAL, errnoOf(r))
}

// TestSpecialFiles: FIFOs, sockets and devices are inodes of the tree
// with their type and device number, linked, renamed and removed like
// files, kept by snapshots; the cluster never opens, reads or writes them.
func TestSpecialFiles(t *testing.T) {
	cases := []struct {
		name string
		mode uint32
		rdev uint64
	}{
		{"fifo", syscall.S_IFIFO | 0o640, 0},
		{"sock", syscall.S_IFSOCK | 0o755, 0},
		{"chr", syscall.S_IFCHR | 0o600, 0x0103}, // /dev/null's 1:3
		{"blk", syscall.S_IFBLK | 0o660, 0x0800}, // 8:0
		{"reg", 0o644, 0},
	}
	h := ft.New(t, fsm.Config{})
	h.OpenSession(60_000)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := "/" + tc.name
			a := h.Must(ft.Mknod(p, tc.mode, tc.rdev)).GetAttr()
			want := tc.mode
			if want&syscall.S_IFMT == 0 {
				want |= syscall.S_IFREG
			}
			require.Equal(t, want, a.GetMode())
			require.Equal(t, tc.rdev, a.GetRdev())
			require.Zero(t, a.GetSize())
			require.Equal(t, syscall.EEXIST, errnoOf(h.Do(ft.Mknod(p, tc.mode, tc.rdev))))

			h.Must(ft.Link(p, p+".link"))
			h.Must(ft.Rename(p+".link", p+".moved"))
			st := h.MustQ(ft.Stat(p + ".moved")).GetAttr()
			require.Equal(t, want, st.GetMode())
			require.Equal(t, tc.rdev, st.GetRdev())
			require.EqualValues(t, 2, st.GetNlink())
			h.Must(ft.Unlink(p + ".moved"))

			if want&syscall.S_IFMT != syscall.S_IFREG {
				require.Equal(t, syscall.ENXIO, errnoOf(h.Do(h.Sess(ft.Open(p, ft.ORdwr, 0)))))
				require.Equal(t, syscall.EINVAL, errnoOf(h.Do(ft.Write(p, 0, []byte("x")))))
				require.Equal(t, syscall.EINVAL, errnoOf(h.Do(ft.Truncate(p, 0))))
			}
		})
	}
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(ft.Mknod("/bad", 0o170000|0o644, 0))))
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(ft.Mknod("/dir", syscall.S_IFDIR|0o755, 0))))

	var buf bytes.Buffer
	_, err := h.F.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	g, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	require.NoError(t, g.Restore(bytes.NewReader(buf.Bytes())))
	st := g.Query(ft.Stat("/chr")).GetAttr()
	require.EqualValues(t, syscall.S_IFCHR|0o600, st.GetMode())
	require.EqualValues(t, 0x0103, st.GetRdev())
}
