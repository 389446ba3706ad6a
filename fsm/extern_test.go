package fsm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"sync"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	"github.com/stretchr/testify/require"
)

// memBlocks is a BlockSink and BlockSource over a map; it records what it
// was given and asked for.
type memBlocks struct {
	mu     sync.Mutex
	m      map[block.Hash][]byte
	puts   int // blocks stored by PutBlock (not already held)
	asked  []fsm.BlockWant
	broken map[block.Hash][]byte // returned instead of the real bytes
}

func newMemBlocks() *memBlocks { return &memBlocks{m: map[block.Hash][]byte{}} }

func (mb *memBlocks) PutBlock(h block.Hash, data []byte) error {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if _, ok := mb.m[h]; !ok {
		mb.m[h] = bytes.Clone(data)
		mb.puts++
	}
	return nil
}

func (mb *memBlocks) Blocks(_ context.Context, want []fsm.BlockWant) (map[block.Hash]*block.Block, error) {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	mb.asked = append(mb.asked, want...)
	out := map[block.Hash]*block.Block{}
	for _, w := range want {
		if d, ok := mb.broken[w.Hash]; ok {
			out[w.Hash] = block.NewBlock(4096, w.Hash, d)
		} else if d, ok := mb.m[w.Hash]; ok {
			out[w.Hash] = block.NewBlock(4096, w.Hash, d)
		}
	}
	return out, nil
}

func externBytes(t testing.TB, f *fsm.FSM, sink fsm.BlockSink) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := f.Snapshot().WriteExternal(&buf, sink)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	return buf.Bytes()
}

// externTree is a small tree with shared blocks, holes and a clone.
func externTree(t *testing.T) *ft.Harness {
	h := newFile(t, fsm.Config{}, "/a")
	h.Must(ft.Write("/a", 0, chunks(4, 1)))
	h.Must(ft.Mkdir("/d", 0o755))
	h.Must(h.Sess(ft.Create("/d/b")))
	h.Must(ft.Write("/d/b", 0, chunks(2, 1)))      // shares two blocks with /a
	h.Must(ft.Write("/d/b", 10*cs, chunks(1, 40))) // a hole before it
	h.Must(ft.Clone("/a", "/d/c", false))
	return h
}

func TestExternalSnapshotRoundTrip(t *testing.T) {
	h := externTree(t)
	mb := newMemBlocks()
	snap := externBytes(t, h.F, mb)
	require.Equal(t, 5, mb.puts, "each unique block is handed over once")
	require.Less(t, len(snap), cs, "the stream carries no block bytes")

	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, g.RestoreFrom(context.Background(), bytes.NewReader(snap), mb))
	require.Equal(t, dump(t, h.F), dump(t, g))
	require.Equal(t, snapBytes(t, h.F), snapBytes(t, g), "restored state writes the same inline snapshot")
	require.Len(t, mb.asked, 5, "a fresh state asks for every unique block, once")

	var scanned []block.Hash
	require.NoError(t, fsm.ScanBlocks(bytes.NewReader(snap), func(hh block.Hash, size uint64) {
		require.Equal(t, uint64(cs), size)
		scanned = append(scanned, hh)
	}))
	require.Len(t, scanned, 4+3+4, "one hash per chunk")
}

func TestExternalSnapshotIsIncremental(t *testing.T) {
	h := externTree(t)
	mb := newMemBlocks()
	externBytes(t, h.F, mb)
	h.Must(ft.Write("/a", cs, chunks(1, 90)))
	before := mb.puts
	externBytes(t, h.F, mb)
	require.Equal(t, before+1, mb.puts, "the second snapshot persists only the changed block")
}

func TestExternalRestoreFetchesOnlyWhatItLacks(t *testing.T) {
	h := externTree(t)
	mb := newMemBlocks()
	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, g.RestoreFrom(context.Background(), bytes.NewReader(externBytes(t, h.F, mb)), mb))

	// The follower's state is older by one write; it lacks one block.
	h.Must(ft.Write("/d/b", 3*cs, chunks(1, 77)))
	mb.asked = nil
	require.NoError(t, g.RestoreFrom(context.Background(), bytes.NewReader(externBytes(t, h.F, mb)), mb))
	require.Len(t, mb.asked, 1)
	require.Equal(t, block.Sum(chunks(1, 77)), mb.asked[0].Hash)
	require.Equal(t, uint64(3), mb.asked[0].Index)
	require.Equal(t, uint64(11*cs), mb.asked[0].FileSize)
	require.Equal(t, dump(t, h.F), dump(t, g))
}

func TestExternalRestoreRefusals(t *testing.T) {
	h := externTree(t)
	mb := newMemBlocks()
	snap := externBytes(t, h.F, mb)
	victim := block.Sum(chunks(1, 40))
	tests := []struct {
		name string
		src  fsm.BlockSource
		want string
	}{
		{"no source", nil, "no source"},
		{"block missing", &memBlocks{m: map[block.Hash][]byte{}}, "want 4096"},
		{"short block", &memBlocks{m: mb.m, broken: map[block.Hash][]byte{victim: make([]byte, 10)}}, "returned 10 bytes"},
		{"source fails", failingSource{}, "boom"},
	}
	g := restored(t, snapBytes(t, newFile(t, fsm.Config{}, "/keep").F))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := snapBytes(t, g)
			err := g.RestoreFrom(context.Background(), bytes.NewReader(snap), tc.src)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, before, snapBytes(t, g), "a refused snapshot changed the state")
		})
	}
	// A 'K' record in a version 1 stream is refused.
	bad := bytes.Clone(snap)
	bad[8] = 1
	binary.LittleEndian.PutUint32(bad[len(bad)-4:], crc32.Checksum(bad[:len(bad)-4], crc32.MakeTable(crc32.Castagnoli)))
	require.ErrorContains(t, g.RestoreFrom(context.Background(), bytes.NewReader(bad), mb), "version 1")
}

type failingSource struct{}

func (failingSource) Blocks(context.Context, []fsm.BlockWant) (map[block.Hash]*block.Block, error) {
	return nil, errors.New("boom")
}

// FuzzScanBlocks: arbitrary bytes never panic the scanner.
func FuzzScanBlocks(f *testing.F) {
	for _, m := range seedFSMs(f) {
		var buf bytes.Buffer
		if _, err := m.Snapshot().WriteExternal(&buf, newMemBlocks()); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = fsm.ScanBlocks(bytes.NewReader(data), func(block.Hash, uint64) {})
	})
}

// FuzzRestoreExternal feeds arbitrary version 2 streams with a source that
// holds the seeds' blocks: no panic, a refusal leaves the state alone, an
// accepted stream writes back identically.
func FuzzRestoreExternal(f *testing.F) {
	src := newMemBlocks()
	for _, m := range seedFSMs(f) {
		var buf bytes.Buffer
		if _, err := m.Snapshot().WriteExternal(&buf, src); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4 {
			body := data[:len(data)-4]
			data = binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
		}
		m, err := fsm.New(fsm.Config{ChunkSize: cs})
		require.NoError(t, err)
		m.Apply(1, ft.Entry(1, ft.Mkdir("/keep", 0o755)))
		before := snapBytes(t, m)
		if err := m.RestoreFrom(context.Background(), bytes.NewReader(data), src); err != nil {
			require.Equal(t, before, snapBytes(t, m))
			return
		}
		require.Equal(t, data, externBytes(t, m, newMemBlocks()))
	})
}
