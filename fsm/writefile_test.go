package fsm_test

import (
	"bytes"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

func writeFileCmd(p string, data []byte, create, trunc, excl bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
		Loc: ft.Path(p), Data: data, Create: create, Truncate: trunc, Excl: excl, Mode: 0o640, Uid: 7, Gid: 8,
	}}}
}

// TestWriteFileOneCommand covers WriteCmd's create/truncate form: the
// os.WriteFile of the protocol.
func TestWriteFileOneCommand(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 3*cs+5)
	tests := []struct {
		name         string
		setup        []*pb.Command
		path         string
		data         []byte
		create, trnc bool
		excl         bool
		errno        syscall.Errno
		want         []byte
	}{
		{name: "creates", path: "/f", data: []byte("hello"), create: true, trnc: true, want: []byte("hello")},
		{name: "creates empty", path: "/f", create: true, want: []byte{}},
		{name: "truncates longer file", setup: []*pb.Command{ft.Write("/g", 0, big)}, path: "/g", data: []byte("hi"), create: true, trnc: true, want: []byte("hi")},
		{name: "overwrites without truncate", setup: []*pb.Command{ft.Write("/g", 0, []byte("abcdef"))}, path: "/g", data: []byte("XY"), create: true, want: []byte("XYcdef")},
		{name: "missing without create", path: "/nope", data: []byte("x"), trnc: true, errno: syscall.ENOENT},
		{name: "excl on existing", path: "/g", data: []byte("x"), create: true, excl: true, errno: syscall.EEXIST},
		{name: "directory", setup: []*pb.Command{ft.Mkdir("/d", 0o755)}, path: "/d", data: []byte("x"), create: true, trnc: true, errno: syscall.EISDIR},
		{name: "parent missing", path: "/no/f", data: []byte("x"), create: true, errno: syscall.ENOENT},
		{name: "dot name", path: "/.", data: []byte("x"), create: true, errno: syscall.EISDIR},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := ft.New(t, fsm.Config{ChunkSize: cs})
			h.Must(writeFileCmd("/g", []byte("seed"), true, true, false))
			for _, c := range tc.setup {
				h.Must(c)
			}
			before := dump(t, h.F)
			r := h.Do(writeFileCmd(tc.path, tc.data, tc.create, tc.trnc, tc.excl))
			if tc.errno != 0 {
				require.Equal(t, uint32(tc.errno), r.Errno, r.Message)
				require.Equal(t, before, dump(t, h.F), "a refused write changed the tree")
				return
			}
			require.Zero(t, r.Errno, r.Message)
			got := h.MustQ(ft.Read(tc.path, 0, 1<<20))
			require.Equal(t, tc.want, append([]byte{}, got.Data...))
			st := h.MustQ(ft.Stat(tc.path))
			require.Equal(t, uint64(len(tc.want)), st.Attr.Size)
		})
	}
}

func TestWriteFileCreatesWithModeAndOwner(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(writeFileCmd("/f", []byte("x"), true, true, false))
	a := h.MustQ(ft.Stat("/f")).Attr
	require.Equal(t, uint32(0o100640), a.Mode)
	require.Equal(t, uint32(7), a.Uid)
	require.Equal(t, uint32(8), a.Gid)
	require.Equal(t, uint32(1), a.Nlink)
}

func TestWriteFileTruncateRespectsBudget(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs, MemoryLimit: 4 * cs})
	full := distinct(4*cs, 1)
	h.Must(writeFileCmd("/f", full, true, true, false))
	// Replacing the whole content frees what it replaces: it fits.
	other := distinct(4*cs, 2)
	h.Must(writeFileCmd("/f", other, true, true, false))
	// A second file does not.
	before := dump(t, h.F)
	r := h.Do(writeFileCmd("/g", full, true, true, false))
	require.Equal(t, uint32(syscall.ENOSPC), r.Errno)
	require.Equal(t, before, dump(t, h.F))
}

// distinct returns n bytes whose chunks all differ, so dedup cannot help.
func distinct(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i/cs) + byte(i%251)
	}
	return b
}
