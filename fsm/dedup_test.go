package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// mixedWrite expresses writing data at off into p as a WriteCmd with one
// hash entry per piece (the write cut at chunk boundaries): a whole,
// aligned piece that f stores and pick accepts goes by hash; every other
// piece as data, a whole aligned one with its sum when sum accepts it, as
// the leader sends them. It returns nil when no piece goes by hash or
// with a sum.
func mixedWrite(f *fsm.FSM, p string, off int64, data []byte, pick, sum func(i int) bool) *pb.Command {
	w := &pb.WriteCmd{Loc: ft.Path(p), Offset: off, Length: uint64(len(data))}
	used := false
	for i, pos := 0, off; pos < off+int64(len(data)); i++ {
		next := min((pos/cs+1)*cs, off+int64(len(data)))
		piece := data[pos-off : next-off]
		h, stored := f.StoredChunk(piece)
		whole := pos%cs == 0 && len(piece) == cs
		switch {
		case whole && stored && pick(i):
			w.Hashes, w.Sums = append(w.Hashes, h), append(w.Sums, nil)
			used = true
		case whole && sum(i):
			w.Hashes, w.Sums = append(w.Hashes, nil), append(w.Sums, h)
			w.Data = append(w.Data, piece...)
			used = true
		default:
			w.Hashes, w.Sums = append(w.Hashes, nil), append(w.Sums, nil)
			w.Data = append(w.Data, piece...)
		}
		pos = next
	}
	if !used {
		return nil
	}
	return &pb.Command{Op: &pb.Command_Write{Write: w}}
}

// TestMixedWritesMatchDataWrites applies the same random writes to two
// state machines, to one as plain data and to the other with stored
// chunks named by hash wherever possible and most other whole chunks
// carrying their sums, and requires identical trees, contents and block
// accounting after every step.
func TestMixedWritesMatchDataWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	plain := newFile(t, fsm.Config{}, "/f")
	mixed := newFile(t, fsm.Config{}, "/f")
	// A pool of chunk contents so that later writes find stored blocks.
	pool := make([][]byte, 6)
	for i := range pool {
		pool[i] = make([]byte, cs)
		randFill(pool[i], uint64(100+i))
	}
	byHash := 0
	for i := range 600 {
		off := int64(rng.IntN(8 * cs))
		if rng.IntN(4) != 0 {
			off -= off % cs
		}
		var data []byte
		for len(data) < rng.IntN(4*cs)+1 {
			data = append(data, pool[rng.IntN(len(pool))]...)
		}
		if rng.IntN(2) == 0 {
			data = data[:rng.IntN(len(data))+1]
		}
		cmd := ft.Write("/f", off, data)
		plain.Must(cmd)
		pick := func(int) bool { return rng.IntN(4) != 0 }
		if m := mixedWrite(mixed.F, "/f", off, data, pick, pick); m != nil {
			cmd, byHash = m, byHash+1
		}
		mixed.Must(cmd)
		if rng.IntN(20) == 0 {
			size := int64(rng.IntN(6 * cs))
			plain.Must(ft.Truncate("/f", size))
			mixed.Must(ft.Truncate("/f", size))
		}
		require.Equal(t, dump(t, plain.F), dump(t, mixed.F), "step %d", i)
	}
	require.Greater(t, byHash, 100, "too few writes went by hash to test anything")
}

func TestMixedWriteErrors(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/a")
	stored := chunks(2, 'a')
	h.Must(ft.Write("/a", 0, stored))
	ha, _ := h.F.StoredChunk(stored[:cs])
	missing := sha256.Sum256([]byte("not stored"))
	h.Must(h.Sess(ft.Create("/b")))
	w := func(off int64, length uint64, data []byte, hs ...[]byte) *pb.Command {
		return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: ft.Path("/b"), Offset: off, Length: length, Data: data, Hashes: hs}}}
	}
	// summed is w with sums.
	summed := func(c *pb.Command, sums ...[]byte) *pb.Command {
		c.GetWrite().Sums = sums
		return c
	}
	fresh := bytes.Repeat([]byte{7}, cs)
	sum := sha256.Sum256(fresh)
	tests := []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"data short", w(100, 2*cs-100, make([]byte, cs-101), nil, ha), syscall.EINVAL},
		{"data long", w(100, 2*cs-100, make([]byte, cs-99), nil, ha), syscall.EINVAL},
		{"hash on unaligned piece", w(100, 2*cs-100, make([]byte, cs), ha, nil), syscall.EINVAL},
		{"too few entries", w(100, 2*cs-100, make([]byte, cs-100), nil), syscall.EINVAL},
		{"hash on partial piece", w(0, cs+100, make([]byte, cs), nil, ha), syscall.EINVAL},
		{"one missing", w(100, 2*cs-100, bytes.Repeat([]byte{1}, cs-100), nil, missing[:]), syscall.EREMOTEIO},
		{"sums without pieces", summed(w(0, cs, fresh), sum[:]), syscall.EINVAL},
		{"fewer sums than pieces", summed(w(0, 2*cs, append(fresh, fresh...), nil, nil), sum[:]), syscall.EINVAL},
		{"sum of a short hash", summed(w(0, cs, fresh, nil), sum[:5]), syscall.EINVAL},
		{"sum on a piece by hash", summed(w(0, cs, nil, ha), ha), syscall.EINVAL},
		{"sum on a partial piece", summed(w(100, cs-100, fresh[100:], nil), sum[:]), syscall.EINVAL},
		{"unaligned edge and a stored chunk", w(100, 2*cs-100, bytes.Repeat([]byte{1}, cs-100), nil, ha), 0},
	}
	for _, tc := range tests {
		before := dump(t, h.F)
		r := h.Do(h.Sess(tc.cmd))
		require.Equal(t, tc.want, errnoOf(r), "%s: %s", tc.name, r.Message)
		if tc.want != 0 {
			require.Equal(t, before, dump(t, h.F), tc.name)
		}
	}
	want := append(append(make([]byte, 100), bytes.Repeat([]byte{1}, cs-100)...), stored[:cs]...)
	require.Equal(t, want, h.MustQ(ft.Read("/b", 0, 1<<20)).Data)
}

// TestRemoteIOIsNotRecorded: a write refused with EREMOTEIO is resent by
// the leader with its data under the same (session, seq); the resend must
// apply instead of getting the recorded refusal.
func TestRemoteIOIsNotRecorded(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	data := chunks(1, 'x')
	h.Must(ft.Write("/f", 0, data))
	hx, _ := h.F.StoredChunk(data)
	h.Must(ft.Remove("/f")) // frees the block the next write names
	h.Must(h.Sess(ft.Create("/g")))
	slim := h.Sess(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
		Loc: ft.Path("/g"), Length: cs, Hashes: [][]byte{hx}}}})
	require.Equal(t, syscall.EREMOTEIO, errnoOf(h.Do(slim)))
	full := &pb.Command{Session: slim.Session, Seq: slim.Seq, Ack: slim.Ack,
		Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path("/g"), Data: data}}}
	require.Equal(t, uint64(cs), h.Must(full).N)
	// The recorded success answers a later duplicate of either form.
	require.Equal(t, uint64(cs), h.Must(slim).N)
	require.Equal(t, data, h.MustQ(ft.Read("/g", 0, cs)).Data)
	require.Equal(t, uint64(cs), h.F.Stats().Block.PhysicalBytes)
}

// TestRefWriteWithinBudget: naming by hash the block a chunk already
// holds frees nothing, so it must not be counted as room for new data.
func TestRefWriteWithinBudget(t *testing.T) {
	h := newFile(t, fsm.Config{MemoryLimit: 2 * cs}, "/f")
	data := chunks(2, 'a')
	h.Must(ft.Write("/f", 0, data))
	ha, _ := h.F.StoredChunk(data[:cs])
	before := dump(t, h.F)
	// Chunk 0 keeps its block (by hash), chunk 1 gets new content: that
	// frees chunk 1's old block, so it fits exactly.
	fresh := bytes.Repeat([]byte{'z'}, cs)
	w := &pb.WriteCmd{Loc: ft.Path("/f"), Length: 2 * cs, Hashes: [][]byte{ha, nil}, Data: fresh}
	require.Zero(t, errnoOf(h.Do(&pb.Command{Op: &pb.Command_Write{Write: w}})))
	require.NotEqual(t, before, dump(t, h.F))
	// Now re-reference chunk 0 and add a third chunk: no room.
	w = &pb.WriteCmd{Loc: ft.Path("/f"), Length: 3 * cs, Hashes: [][]byte{ha, nil, nil},
		Data: append(bytes.Repeat([]byte{'z'}, cs), bytes.Repeat([]byte{'q'}, cs)...)}
	before = dump(t, h.F)
	require.Equal(t, syscall.ENOSPC, errnoOf(h.Do(&pb.Command{Op: &pb.Command_Write{Write: w}})))
	require.Equal(t, before, dump(t, h.F))
}

// TestEntryCarriesTheBudget: the budget an entry carries is the one
// enforced, whatever the replica's own configuration, so replicas
// configured differently still refuse the same writes.
func TestEntryCarriesTheBudget(t *testing.T) {
	small := newFile(t, fsm.Config{MemoryLimit: cs}, "/f")
	large := newFile(t, fsm.Config{MemoryLimit: 100 * cs}, "/f")
	for round, tc := range []struct {
		limit uint64
		want  syscall.Errno
	}{{2 * cs, 0}, {cs, syscall.ENOSPC}, {fsm.NoMemoryLimit, 0}} {
		data := chunks(2, byte('a'+2*round)) // new content, at a new offset
		for _, h := range []*ft.Harness{small, large} {
			e := ft.Entry(h.Time, ft.Write("/f", int64(8*cs*round), data))
			e.MemoryLimit = tc.limit
			h.Index++
			r := h.F.Apply(h.Index, e)
			require.Equal(t, tc.want, errnoOf(r[0]), "limit %d: %s", tc.limit, r[0].Message)
		}
		require.Equal(t, dump(t, small.F), dump(t, large.F))
	}
	require.Zero(t, small.F.Stats().Block.Limit, "no budget after NoMemoryLimit")
	e := ft.Entry(small.Time, ft.Write("/f", 0, chunks(1, 'z')))
	small.Index++
	small.F.Apply(small.Index, e) // 0 keeps the budget in force
	require.Zero(t, small.F.Stats().Block.Limit)
}

// BenchmarkCloneTree10k applies one recursive CloneCmd of a tree of 10,000
// 4 KiB files in 100 directories to the state machine alone:
//
//	go test ./fsm/ -run '^$' -bench CloneTree10k -benchtime 10x
func BenchmarkCloneTree10k(b *testing.B) {
	h := ft.New(b, fsm.Config{})
	h.Must(ft.Mkdir("/src", 0o755))
	data := make([]byte, 4096)
	for d := range 100 {
		dir := fmt.Sprintf("/src/d%d", d)
		h.Must(ft.Mkdir(dir, 0o755))
		cmds := make([]*pb.Command, 100)
		for f := range cmds {
			binary.LittleEndian.PutUint64(data, uint64(d*100+f))
			cmds[f] = &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: ft.Path(fmt.Sprintf("%s/f%d", dir, f)),
				Data: append([]byte(nil), data...), Create: true, Mode: 0o644}}}
		}
		for _, r := range h.Apply(cmds...) {
			require.Zero(b, r.Errno, r.Message)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		h.Must(ft.Clone("/src", fmt.Sprintf("/dst%d", i), true))
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/clone")
}

// TestSumsOnAnAppendHandle: the leader cuts a write into pieces for its
// offset, unaware that the handle was opened O_APPEND. Pieces with sums
// only then fit chunks the write no longer covers, and the write applies
// as its plain data at the end of file, hashed by the replica; with a
// piece by hash it is refused for a resend, as before.
func TestSumsOnAnAppendHandle(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	head := []byte("head")
	h.Must(ft.Write("/f", 0, head))
	open := h.Must(h.Sess(ft.Open("/f", ft.OWronly|ft.OAppend, 0)))
	data := chunks(2, 'q')
	sum0, _ := h.F.StoredChunk(data[:cs])
	sum1, _ := h.F.StoredChunk(data[cs:])
	w := &pb.WriteCmd{Handle: open.Handle, Offset: 0, Length: 2 * cs, Data: data,
		Hashes: [][]byte{nil, nil}, Sums: [][]byte{sum0, sum1}}
	require.Equal(t, uint64(2*cs), h.Must(h.Sess(&pb.Command{Op: &pb.Command_Write{Write: w}})).N)
	require.Equal(t, append(append([]byte(nil), head...), data...), h.MustQ(ft.Read("/f", 0, 1<<20)).Data)

	w = &pb.WriteCmd{Handle: open.Handle, Offset: 0, Length: 2 * cs, Data: data[cs:],
		Hashes: [][]byte{sum0, nil}, Sums: [][]byte{nil, sum1}}
	require.Equal(t, syscall.EREMOTEIO, errnoOf(h.Do(h.Sess(&pb.Command{Op: &pb.Command_Write{Write: w}}))))
}
