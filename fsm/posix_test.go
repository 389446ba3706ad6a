package fsm_test

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// pop is one step of a POSIX comparison: an operation on paths relative
// to the test root (symlink targets are kept relative so that both sides
// resolve them alike).
type pop struct {
	op   string
	a, b string
}

// posixSide runs steps on a local directory through syscalls.
type posixSide struct{ root string }

func (p posixSide) path(s string) string {
	if strings.HasSuffix(s, "/") {
		return filepath.Join(p.root, s) + "/" // Join would drop it
	}
	return filepath.Join(p.root, s)
}

func (p posixSide) do(s pop) (syscall.Errno, *syscall.Stat_t) {
	var err error
	var st syscall.Stat_t
	switch s.op {
	case "mkdir":
		err = syscall.Mkdir(p.path(s.a), 0o755)
	case "rmdir":
		err = syscall.Rmdir(p.path(s.a))
	case "unlink":
		err = syscall.Unlink(p.path(s.a))
	case "rename":
		err = syscall.Rename(p.path(s.a), p.path(s.b))
	case "symlink":
		err = syscall.Symlink(s.b, p.path(s.a))
	case "link":
		err = syscall.Link(p.path(s.a), p.path(s.b))
	case "creat", "creatx", "openrw", "openro", "openw":
		flags := map[string]int{"creat": syscall.O_CREAT | syscall.O_WRONLY, "creatx": syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY,
			"openrw": syscall.O_RDWR, "openro": syscall.O_RDONLY, "openw": syscall.O_WRONLY}[s.op]
		var fd int
		if fd, err = syscall.Open(p.path(s.a), flags, 0o644); err == nil {
			syscall.Close(fd)
		}
	case "write":
		var fd int
		if fd, err = syscall.Open(p.path(s.a), syscall.O_WRONLY, 0); err == nil {
			_, err = syscall.Pwrite(fd, []byte(s.b), 3)
			syscall.Close(fd)
		}
	case "truncate":
		err = syscall.Truncate(p.path(s.a), 10)
	case "readlink":
		buf := make([]byte, 4096)
		_, err = syscall.Readlink(p.path(s.a), buf)
	case "stat":
		err = syscall.Stat(p.path(s.a), &st)
	case "lstat":
		err = syscall.Lstat(p.path(s.a), &st)
	default:
		panic("unknown step " + s.op)
	}
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		panic(err)
	}
	if err != nil || (s.op != "stat" && s.op != "lstat") {
		return errno, nil
	}
	return 0, &st
}

// memSide runs the same steps on the state machine.
type memSide struct{ h *ft.Harness }

func (m memSide) path(s string) string { return "/" + s }

func (m memSide) do(s pop) (syscall.Errno, *pb.Attr) {
	h := m.h
	var r *pb.Result
	openClose := func(flags uint32) *pb.Result {
		r := h.Do(h.Sess(ft.Open(m.path(s.a), flags, 0o644)))
		if r.Errno == 0 {
			h.Must(h.Sess(ft.Close(r.Handle)))
		}
		return r
	}
	switch s.op {
	case "mkdir":
		r = h.Do(ft.Mkdir(m.path(s.a), 0o755))
	case "rmdir":
		r = h.Do(ft.Rmdir(m.path(s.a)))
	case "unlink":
		r = h.Do(ft.Unlink(m.path(s.a)))
	case "rename":
		r = h.Do(ft.Rename(m.path(s.a), m.path(s.b)))
	case "symlink":
		r = h.Do(ft.Symlink(s.b, m.path(s.a)))
	case "link":
		r = h.Do(ft.Link(m.path(s.a), m.path(s.b)))
	case "creat":
		r = openClose(ft.OCreat | ft.OWronly)
	case "creatx":
		r = openClose(ft.OCreat | ft.OExcl | ft.OWronly)
	case "openrw":
		r = openClose(ft.ORdwr)
	case "openro":
		r = openClose(ft.ORdonly)
	case "openw":
		r = openClose(ft.OWronly)
	case "write":
		r = h.Do(ft.Write(m.path(s.a), 3, []byte(s.b)))
	case "truncate":
		r = h.Do(ft.Truncate(m.path(s.a), 10))
	case "readlink":
		r = h.Q(ft.Readlink(m.path(s.a)))
	case "stat":
		r = h.Q(ft.Stat(m.path(s.a)))
	case "lstat":
		r = h.Q(ft.Lstat(m.path(s.a)))
	}
	return syscall.Errno(r.Errno), r.Attr
}

func TestPosixCompare(t *testing.T) {
	long := strings.Repeat("a", 256)
	seqs := map[string][]pop{
		"mkdir and rmdir": {{"mkdir", "a", ""}, {"mkdir", "a", ""}, {"stat", "a", ""}, {"rmdir", "a", ""}, {"rmdir", "a", ""}, {"stat", "a", ""}},
		"files and dirs": {{"creat", "f", ""}, {"mkdir", "f/x", ""}, {"rmdir", "f", ""}, {"stat", "f/", ""}, {"openro", "f/", ""},
			{"unlink", "f", ""}, {"unlink", "f", ""}, {"openrw", "f", ""}, {"creat", "nodir/f", ""}},
		"non-empty dirs": {{"mkdir", "d", ""}, {"creat", "d/f", ""}, {"rmdir", "d", ""}, {"unlink", "d", ""},
			{"rename", "d", "d/x"}, {"rename", "d/f", "d"}, {"mkdir", "e", ""}, {"rename", "e", "d"},
			{"rename", "d/f", "e"}, {"rename", "e", "d/f"}, {"stat", "d", ""}, {"stat", "e", ""}},
		"rename replaces": {{"creat", "f", ""}, {"write", "f", "hello"}, {"creat", "g", ""}, {"rename", "f", "g"},
			{"stat", "f", ""}, {"stat", "g", ""}, {"mkdir", "a", ""}, {"mkdir", "b", ""}, {"rename", "a", "b"},
			{"stat", "a", ""}, {"stat", "b", ""}, {"rename", "nope", "x"}, {"rename", "g", "nodir/x"}},
		"hard links": {{"mkdir", "d", ""}, {"link", "d", "d2"}, {"creat", "f", ""}, {"link", "f", "h"}, {"stat", "f", ""},
			{"link", "f", "h"}, {"rename", "f", "h"}, {"stat", "f", ""}, {"stat", "h", ""}, {"unlink", "f", ""}, {"stat", "h", ""},
			{"link", "nope", "x"}},
		"symlinks": {{"symlink", "l1", "l2"}, {"symlink", "l2", "l1"}, {"stat", "l1", ""}, {"lstat", "l1", ""},
			{"creat", "l1/x", ""}, {"readlink", "l1", ""}, {"symlink", "dang", "nothing"}, {"stat", "dang", ""},
			{"openrw", "dang", ""}, {"creat", "dang", ""}, {"stat", "nothing", ""}, {"creatx", "dang", ""},
			{"mkdir", "dir", ""}, {"symlink", "ld", "dir"}, {"creat", "ld/f", ""}, {"stat", "dir/f", ""}, {"readlink", "dir", ""},
			{"rmdir", "ld", ""}, {"unlink", "ld", ""}, {"stat", "dir", ""}, {"symlink", "dir", "x"}},
		"names": {{"mkdir", long, ""}, {"creat", long[:255], ""}, {"stat", long[:255], ""}, {"stat", long, ""}},
		"open modes": {{"mkdir", "d", ""}, {"openw", "d", ""}, {"openrw", "d", ""}, {"openro", "d", ""}, {"truncate", "d", ""},
			{"creat", "d", ""}, {"creat", "f", ""}, {"creatx", "f", ""}, {"truncate", "f", ""}, {"stat", "f", ""},
			{"write", "d", "x"}, {"write", "f", "abc"}, {"stat", "f", ""}, {"truncate", "nope", ""}},
		"rmdir then reuse": {{"mkdir", "a", ""}, {"mkdir", "a/b", ""}, {"stat", "a", ""}, {"rmdir", "a/b", ""}, {"stat", "a", ""},
			{"rmdir", "a", ""}, {"creat", "a", ""}, {"stat", "a", ""}, {"mkdir", "a", ""}},
	}
	for name, steps := range seqs {
		t.Run(name, func(t *testing.T) {
			local := posixSide{root: t.TempDir()}
			h := ft.New(t, fsm.Config{ChunkSize: 4096})
			h.OpenSession(60_000)
			mem := memSide{h: h}
			for i, s := range steps {
				want, st := local.do(s)
				got, a := mem.do(s)
				require.Equal(t, want, got, "step %d %v: local %v, memfs %v", i, s, want, got)
				if st != nil {
					require.NotNil(t, a)
					require.Equal(t, st.Mode&syscall.S_IFMT, a.Mode&syscall.S_IFMT, "step %d %v: type", i, s)
					require.Equal(t, uint64(st.Nlink), uint64(a.Nlink), "step %d %v: nlink", i, s)
					if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
						require.Equal(t, st.Size, int64(a.Size), "step %d %v: size", i, s)
					}
				}
			}
		})
	}
}
