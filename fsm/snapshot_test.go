package fsm_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"syscall"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

func snapBytes(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	sn := f.Snapshot()
	n, err := sn.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	require.Equal(t, f.AppliedIndex(), sn.Index())
	return buf.Bytes()
}

func restored(t testing.TB, snap []byte, limit ...uint64) *fsm.FSM {
	t.Helper()
	cfg := fsm.Config{ChunkSize: 1 << 16}
	if len(limit) > 0 {
		cfg.MemoryLimit = limit[0]
	}
	f, err := fsm.New(cfg)
	require.NoError(t, err)
	require.NoError(t, f.Restore(bytes.NewReader(snap)))
	return f
}

// TestDeterminism feeds one random log to two state machines (one through
// ApplyBytes) and compares every result and the snapshots byte for byte;
// a restored copy then follows the rest of the log in step.
func TestDeterminism(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		log := genLog(seed, 3000)
		a, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
		require.NoError(t, err)
		b, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
		require.NoError(t, err)
		var c *fsm.FSM
		for i, e := range log {
			idx := uint64(i + 1)
			ra := a.Apply(idx, e)
			rb, err := b.ApplyBytes(idx, ft.Marshal(e))
			require.NoError(t, err)
			require.Equal(t, len(ra), len(rb))
			for j := range ra {
				require.True(t, proto.Equal(ra[j], rb[j]), "entry %d command %d: %v vs %v", idx, j, ra[j], rb[j])
			}
			require.NoError(t, a.CheckNames(), "entry %d", idx)
			require.NoError(t, b.CheckNames(), "entry %d", idx)
			if c != nil {
				rc := c.Apply(idx, e)
				require.NoError(t, c.CheckNames(), "restored copy: entry %d", idx)
				for j := range ra {
					require.True(t, proto.Equal(ra[j], rc[j]), "restored copy: entry %d command %d: %v vs %v", idx, j, ra[j], rc[j])
				}
			}
			if i == len(log)/2 {
				c = restored(t, snapBytes(t, a), genLimit)
				c2 := restored(t, snapBytes(t, a))
				require.Equal(t, snapBytes(t, c), snapBytes(t, c2))
			}
		}
		sa, sb, sc := snapBytes(t, a), snapBytes(t, b), snapBytes(t, c)
		require.Equal(t, sa, sb, "seed %d", seed)
		require.Equal(t, sa, sc, "seed %d", seed)
		require.Equal(t, dump(t, a), dump(t, c))
		require.Equal(t, a.Stats(), c.Stats())
		st := a.Stats()
		t.Logf("seed %d: %d inodes, %d blocks, %d bytes logical, %d physical, %d sessions, snapshot %d bytes",
			seed, st.Inodes, st.Block.Blocks, st.LogicalBytes, st.Block.PhysicalBytes, st.Sessions, len(sa))
		require.Greater(t, st.Inodes, uint64(5), "the log should build a tree worth comparing")
	}
}

func TestSnapshotBlocksWrittenOnce(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	data := chunks(4, 1)
	h.Must(ft.Write("/f", 0, data))
	base := len(snapBytes(t, h.F))
	for _, p := range []string{"/g", "/h", "/i"} {
		h.Must(ft.Clone("/f", p, false))
	}
	grown := len(snapBytes(t, h.F)) - base
	require.Less(t, grown, 3*(cs/4), "clones add references, not bytes")
	f := restored(t, snapBytes(t, h.F))
	require.Equal(t, dump(t, h.F), dump(t, f))
	require.Equal(t, uint64(4*cs), f.Stats().Block.PhysicalBytes)
	require.Equal(t, uint64(16), f.Stats().Block.Refs, "reference counts are recomputed")
	require.Equal(t, cs, f.Stats().ChunkSize, "the snapshot's chunk size wins")
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	h.Must(ft.Write("/f", 0, chunks(2, 1)))
	h.Must(ft.Mkdir("/d", 0o755))
	good := snapBytes(t, h.F)
	resum := func(b []byte) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
		return b
	}
	blockAt := bytes.Index(good, bytes.Repeat([]byte{1}, 100))
	require.Positive(t, blockAt)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"bad magic", append([]byte("NOTASNAP"), good[8:]...), "bad magic"},
		{"future version", append([]byte("MEMFSNAP\x03"), good[9:]...), "version 3"},
		{"truncated", good[:len(good)/2], "truncated"},
		{"no checksum", good[:len(good)-4], "truncated"},
		{"flipped byte", func() []byte { b := bytes.Clone(good); b[len(b)/3] ^= 0x40; return b }(), ""},
		{"block content changed", func() []byte { b := bytes.Clone(good); b[blockAt+5] = 9; return resum(b) }(), "does not match its hash"},
		{"checksum", func() []byte { b := bytes.Clone(good); b[len(b)-1] ^= 1; return b }(), "checksum"},
	}
	f := restored(t, good)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := snapBytes(t, f)
			err := f.Restore(bytes.NewReader(tc.data))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.Equal(t, before, snapBytes(t, f), "a refused snapshot changed the state")
		})
	}
	// An I/O error from the reader is reported as such.
	err := f.Restore(io.MultiReader(bytes.NewReader(good[:100]), errReader{}))
	require.ErrorIs(t, err, syscall.EIO)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, syscall.EIO }
