package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

const cs = 4096 // chunk size of the data tests

func newFile(t *testing.T, cfg fsm.Config, p string) *ft.Harness {
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = cs
	}
	h := ft.New(t, cfg)
	h.OpenSession(60_000)
	r := h.Must(h.Sess(ft.Create(p)))
	h.Must(h.Sess(ft.Close(r.Handle)))
	return h
}

// TestWriteReadModel runs random writes, truncates and reads against a
// byte-slice model of the file.
func TestWriteReadModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := newFile(t, fsm.Config{}, "/f")
	var model []byte
	for i := range 3000 {
		switch rng.IntN(10) {
		case 0, 1, 2, 3, 4:
			off := rng.IntN(6 * cs)
			data := make([]byte, rng.IntN(3*cs)+1)
			if rng.IntN(3) == 0 { // zeros make holes
				for j := range data {
					data[j] = byte(rng.IntN(256))
				}
			}
			if rng.IntN(4) == 0 {
				clear(data[:len(data)/2])
			}
			r := h.Must(ft.Write("/f", int64(off), data))
			require.Equal(t, uint64(len(data)), r.N)
			if off+len(data) > len(model) {
				model = append(model, make([]byte, off+len(data)-len(model))...)
			}
			copy(model[off:], data)
		case 5:
			size := rng.IntN(7 * cs)
			h.Must(ft.Truncate("/f", int64(size)))
			if size > len(model) {
				model = append(model, make([]byte, size-len(model))...)
			}
			model = model[:size]
		default:
			off, n := rng.IntN(7*cs), rng.IntN(3*cs)
			r := h.MustQ(ft.Read("/f", int64(off), int64(n)))
			want := []byte{}
			if off < len(model) {
				want = model[off:min(off+n, len(model))]
			}
			require.Equal(t, want, append([]byte{}, r.Data...), "step %d: read %d at %d", i, n, off)
			require.Equal(t, off+n >= len(model), r.Eof)
		}
		st := h.MustQ(ft.Stat("/f")).Attr
		require.Equal(t, uint64(len(model)), st.Size)
		require.Equal(t, uint64(len(model)), h.F.Stats().LogicalBytes)
	}
	r := h.MustQ(ft.Read("/f", 0, int64(len(model))))
	require.Equal(t, model, r.Data)
	// Physical bytes never exceed what the non-zero chunks need.
	require.LessOrEqual(t, h.F.Stats().Block.PhysicalBytes, uint64(len(model)))
}

func TestHolesAreNotStored(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	h.Must(ft.Write("/f", 10*cs, []byte("end")))
	h.Must(ft.Write("/f", 0, make([]byte, 3*cs))) // zeros: no block
	st := h.F.Stats()
	require.Equal(t, uint64(1), st.Block.Blocks)
	require.Equal(t, uint64(3), st.Block.PhysicalBytes)
	a := h.MustQ(ft.Stat("/f")).Attr
	require.Equal(t, uint64(10*cs+3), a.Size)
	require.Equal(t, uint64(1), a.Blocks, "one 512-byte unit covers the stored 3 bytes")
	r := h.MustQ(ft.Read("/f", 5*cs, 100))
	require.Equal(t, make([]byte, 100), r.Data)
	require.False(t, r.Eof)
	// A write of zeros over data turns the chunk back into a hole.
	h.Must(ft.Write("/f", 10*cs, make([]byte, 3)))
	require.Zero(t, h.F.Stats().Block.Blocks)
}

func TestReadWithinChunkOwnsItsBuffer(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	data := bytes.Repeat([]byte("abcdefgh"), cs/8)
	h.Must(ft.Write("/f", 0, data))
	a := h.MustQ(ft.Read("/f", 10, 100)).Data
	require.Equal(t, data[10:110], a)
	// Block bytes go back to the kernel once the block is unreachable, so a
	// read result must not alias them.
	a[0] = 'X'
	require.Equal(t, data[10:110], h.MustQ(ft.Read("/f", 10, 100)).Data)
}

func TestTruncateShrinkGrow(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	h.Must(ft.Write("/f", 0, bytes.Repeat([]byte{7}, 3*cs)))
	h.Must(ft.Truncate("/f", cs+10))
	require.Equal(t, uint64(cs+10), h.F.Stats().Block.PhysicalBytes-0)
	h.Must(ft.Truncate("/f", 3*cs))
	r := h.MustQ(ft.Read("/f", 0, 3*cs))
	want := append(bytes.Repeat([]byte{7}, cs+10), make([]byte, 2*cs-10)...)
	require.Equal(t, want, r.Data, "bytes past a shrink read as zeros after growing again")
	h.Must(ft.Truncate("/f", 0))
	require.Zero(t, h.F.Stats().Block.Blocks)
}

func TestDedupIdenticalFiles(t *testing.T) {
	h := ft.New(t, fsm.Config{}) // default 64 KiB chunks
	h.OpenSession(60_000)
	data := make([]byte, 4<<20)
	randFill(data, 3)
	for i := range 10 {
		p := "/f" + string(rune('0'+i))
		r := h.Must(h.Sess(ft.Create(p)))
		h.Must(h.Sess(ft.WriteH(r.Handle, 0, data)))
		h.Must(h.Sess(ft.Close(r.Handle)))
	}
	st := h.F.Stats()
	require.Equal(t, uint64(len(data)), st.Block.PhysicalBytes)
	require.Equal(t, uint64(10*len(data)), st.LogicalBytes)
	require.InDelta(t, 10.0, st.Block.DedupRatio(), 0.001)
	u := h.MustQ(ft.Usage("/")).Usage
	require.Equal(t, &pb.TreeUsage{Files: 10, LogicalBytes: 10 << 22, PhysicalBytes: 4 << 20, SharedBytes: 4 << 20}, u)
	u = h.MustQ(ft.Usage("/f0")).Usage
	require.Equal(t, uint64(4<<20), u.SharedBytes, "blocks also held outside the subtree are shared")
	for i := range 10 {
		h.Must(ft.Remove("/f" + string(rune('0'+i))))
	}
	st = h.F.Stats()
	require.Zero(t, st.Block.PhysicalBytes)
	require.Zero(t, st.Block.Refs)
}

func TestMemoryBudget(t *testing.T) {
	h := newFile(t, fsm.Config{MemoryLimit: 4 * cs}, "/f")
	h.Must(ft.Write("/f", 0, chunks(3, 1)))
	before := dump(t, h.F)
	tests := []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"two new chunks", ft.Write("/f", 3*cs, chunks(2, 10)), syscall.ENOSPC},
		{"partial chunk over budget", ft.Write("/f", 3*cs, chunks(2, 10)[:cs+1]), syscall.ENOSPC},
		{"rewrite frees what it replaces", ft.Write("/f", 0, chunks(3, 20)), 0},
		{"one more chunk fits", ft.Write("/f", 3*cs, chunks(1, 30)), 0},
		{"full", ft.Write("/f", 4*cs, []byte{5}), syscall.ENOSPC},
		{"duplicate content needs no space", ft.Write("/f", 4*cs, chunks(1, 30)), 0},
		{"holes need no space", ft.Write("/f", 9*cs, make([]byte, cs)), 0},
		{"shrinking to a cut chunk when full", ft.Truncate("/f", cs/2), 0},
	}
	for i, tc := range tests {
		r := h.Do(tc.cmd)
		require.Equal(t, tc.want, errnoOf(r), "%s: %s", tc.name, r.Message)
		if i == 1 {
			require.Equal(t, before, dump(t, h.F), "ENOSPC changed something")
		}
		require.LessOrEqual(t, h.F.Stats().Block.PhysicalBytes, uint64(4*cs), tc.name)
	}
}

func TestWriteByHash(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/a")
	h.OpenSession(60_000)
	data := make([]byte, 2*cs+100)
	randFill(data, 5)
	h.Must(ft.Write("/a", 0, data))
	hashes := [][]byte{}
	for i := 0; i < len(data); i += cs {
		s := sha256.Sum256(data[i:min(i+cs, len(data))])
		hashes = append(hashes, s[:])
	}
	r := h.Must(h.Sess(ft.Create("/b")))
	ref := func(off int64, hs [][]byte, n uint64) *pb.Command {
		return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path("/b"), Offset: off, Hashes: hs, Length: n}}}
	}
	missing := sha256.Sum256([]byte("not stored"))
	tests := []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"unaligned", ref(1, hashes[:1], cs), syscall.EINVAL},
		{"count mismatch", ref(0, hashes, cs), syscall.EINVAL},
		{"bad hash length", ref(0, [][]byte{{1, 2}}, cs), syscall.EINVAL},
		{"not stored", ref(0, [][]byte{hashes[0], missing[:]}, 2*cs), syscall.EREMOTEIO},
		{"short block not last", ref(0, [][]byte{hashes[2]}, cs), syscall.EINVAL},
		{"with data too", &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path("/b"), Hashes: hashes, Length: uint64(len(data)), Data: []byte{1}}}}, syscall.EINVAL},
		{"whole file", ref(0, hashes, uint64(len(data))), 0},
	}
	for _, tc := range tests {
		before := dump(t, h.F)
		res := h.Do(tc.cmd)
		require.Equal(t, tc.want, errnoOf(res), "%s: %s", tc.name, res.Message)
		if tc.want != 0 {
			require.Equal(t, before, dump(t, h.F), tc.name)
		}
	}
	require.Equal(t, data, h.MustQ(ft.Read("/b", 0, 1<<20)).Data)
	require.Equal(t, uint64(len(data)), h.F.Stats().Block.PhysicalBytes)
	// A short last block before the end of file would cut the file.
	h.Must(ft.Write("/b", 3*cs, []byte{1}))
	require.Equal(t, syscall.EINVAL, errnoOf(h.Do(ref(2*cs, hashes[2:], 100))))
	_ = r
}

func TestCloneSharesBlocks(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(ft.Mkdir("/src", 0o750))
	h.Must(ft.Mkdir("/src/sub", 0o700))
	h.OpenSession(60_000)
	for _, p := range []string{"/src/f", "/src/sub/g"} {
		r := h.Must(h.Sess(ft.Create(p)))
		h.Must(h.Sess(ft.Close(r.Handle)))
	}
	data := bytes.Repeat([]byte("0123456789"), cs)
	h.Must(ft.Write("/src/f", 0, data))
	h.Must(ft.Write("/src/sub/g", 0, data[:cs]))
	h.Must(ft.Link("/src/f", "/src/sub/hard"))
	h.Must(ft.Symlink("f", "/src/link"))
	h.Must(h.Sess(ft.SetXattr("/src/f", "user.k", []byte("v"), 0)))
	phys := h.F.Stats().Block.PhysicalBytes

	h.Must(ft.Clone("/src", "/dst", true))
	require.Equal(t, phys, h.F.Stats().Block.PhysicalBytes, "a clone stores no bytes")
	require.Equal(t, data, h.MustQ(ft.Read("/dst/f", 0, int64(len(data)))).Data)
	require.Equal(t, "f", h.MustQ(ft.Readlink("/dst/link")).Target)
	require.Equal(t, []byte("v"), h.MustQ(ft.GetXattr("/dst/f", "user.k")).Data)
	f, hard := h.MustQ(ft.Stat("/dst/f")).Attr, h.MustQ(ft.Stat("/dst/sub/hard")).Attr
	require.Equal(t, f.Ino, hard.Ino, "hard links inside the tree stay linked")
	require.Equal(t, uint32(2), f.Nlink)
	require.NotEqual(t, h.MustQ(ft.Stat("/src/f")).Attr.Ino, f.Ino)
	require.Equal(t, uint32(0o40750), h.MustQ(ft.Stat("/dst")).Attr.Mode)
	require.Equal(t, uint32(3), h.MustQ(ft.Stat("/dst")).Attr.Nlink)

	// Writing the clone leaves the source alone (copy on write).
	h.Must(ft.Write("/dst/f", 5, []byte("XX")))
	require.Equal(t, data, h.MustQ(ft.Read("/src/f", 0, int64(len(data)))).Data)
	u := h.MustQ(ft.Usage("/dst")).Usage
	require.Equal(t, uint64(2), u.Files)
	require.Equal(t, uint64(len(data)+cs), u.LogicalBytes)

	// A single file clone.
	h.Must(ft.Clone("/src/sub/g", "/g2", false))
	require.Equal(t, data[:cs], h.MustQ(ft.Read("/g2", 0, cs)).Data)
	require.Equal(t, dump(t, h.F), dump(t, h.F))
}

func TestStatfs(t *testing.T) {
	h := newFile(t, fsm.Config{MemoryLimit: 1 << 20}, "/f")
	h.Must(ft.Write("/f", 0, bytes.Repeat([]byte{1}, 2*cs)))
	h.Must(ft.Write("/f", 4*cs, bytes.Repeat([]byte{1}, cs)))
	s := h.MustQ(ft.Statfs()).Statfs
	require.Equal(t, &pb.Statfs{TotalBytes: 1 << 20, FreeBytes: 1<<20 - cs, Files: 2, BlockSize: cs, MaxNameLen: 255,
		LogicalBytes: 5 * cs, PhysicalBytes: cs, BlockCount: 1}, s)
	h2 := newFile(t, fsm.Config{}, "/f")
	s = h2.MustQ(ft.Statfs()).Statfs
	require.Equal(t, s.TotalBytes, s.FreeBytes+s.PhysicalBytes)
	require.NotZero(t, s.FreeBytes)
}

// randFill fills b with pseudo-random bytes from seed.
func randFill(b []byte, seed uint64) {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	_, _ = r.Read(b)
}

// chunks returns n chunks, chunk i filled with byte first+i.
func chunks(n int, first byte) []byte {
	var b []byte
	for i := range n {
		b = append(b, bytes.Repeat([]byte{first + byte(i)}, cs)...)
	}
	return b
}
