package fsm_test

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// dump describes the whole tree as seen through queries: every reachable
// entry with its attributes, content hash, link target and xattrs, plus
// the block totals. Two states with equal dumps look the same to clients.
func dump(t testing.TB, f *fsm.FSM) string {
	t.Helper()
	var lines []string
	var walk func(ino uint64, path string)
	walk = func(ino uint64, path string) {
		st := f.Query(ft.StatLoc(ft.Ino(ino)))
		require.Zero(t, st.Errno, "stat %s: %s", path, st.Message)
		a := st.Attr
		line := fmt.Sprintf("%s ino=%d mode=%o nlink=%d uid=%d gid=%d size=%d blocks=%d a=%d m=%d c=%d gen=%d",
			path, a.Ino, a.Mode, a.Nlink, a.Uid, a.Gid, a.Size, a.Blocks, a.AtimeNs, a.MtimeNs, a.CtimeNs, a.Generation)
		switch a.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			r := f.Query(&pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: ft.Ino(ino), Length: int64(a.Size)}}})
			require.Zero(t, r.Errno, r.Message)
			line += fmt.Sprintf(" data=%x", sha256.Sum256(r.Data))
		case syscall.S_IFLNK:
			r := f.Query(&pb.Query{Q: &pb.Query_Readlink{Readlink: &pb.ReadlinkQuery{Loc: ft.Ino(ino)}}})
			line += " -> " + r.Target
		}
		xs := f.Query(&pb.Query{Q: &pb.Query_ListXattr{ListXattr: &pb.ListXattrQuery{Loc: &pb.Loc{Ino: ino, Nofollow: true}}}})
		for _, n := range xs.Names {
			v := f.Query(&pb.Query{Q: &pb.Query_GetXattr{GetXattr: &pb.GetXattrQuery{Loc: &pb.Loc{Ino: ino, Nofollow: true}, Name: n}}})
			line += fmt.Sprintf(" x:%s=%q", n, v.Data)
		}
		lines = append(lines, line)
		if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return
		}
		for _, e := range readAll(t, f, ino) {
			walk(e.Ino, path+"/"+e.Name)
		}
	}
	walk(1, "")
	sort.Strings(lines)
	st := f.Stats()
	lines = append(lines, fmt.Sprintf("inodes=%d logical=%d blocks=%d physical=%d refs=%d",
		st.Inodes, st.LogicalBytes, st.Block.Blocks, st.Block.PhysicalBytes, st.Block.Refs))
	return strings.Join(lines, "\n")
}

// readAll lists a directory through paged readdir.
func readAll(t testing.TB, f *fsm.FSM, ino uint64) []*pb.Dirent {
	var out []*pb.Dirent
	cookie := ""
	for {
		r := f.Query(&pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: ft.Ino(ino), Cookie: cookie, Limit: 7}}})
		require.Zero(t, r.Errno, r.Message)
		out = append(out, r.Entries...)
		if r.Eof {
			return out
		}
		cookie = r.Cookie
	}
}

// errnoOf returns a result's errno.
func errnoOf(r *pb.Result) syscall.Errno { return syscall.Errno(r.Errno) }

// ino returns the inode number at path p.
func ino(t testing.TB, h *ft.Harness, p string) uint64 {
	t.Helper()
	return h.MustQ(ft.Lstat(p)).Attr.Ino
}
