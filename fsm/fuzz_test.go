package fsm_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// fuzzBase is a small state every fuzz input starts from.
var (
	fuzzBase  = sync.OnceValue(func() []*pb.Entry { return genLog(11, 40) })
	fuzzAfter = sync.OnceValue(func() []*pb.Entry { return genLog(14, 20) })
)

func fuzzFSM(t *testing.T) *fsm.FSM {
	f, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
	require.NoError(t, err)
	for i, e := range fuzzBase() {
		f.Apply(uint64(i+1), e)
	}
	return f
}

// FuzzApplyBytes feeds arbitrary bytes as a log entry: it must never
// panic, a refused entry must change nothing, and whatever it did must
// leave a state whose snapshot restores (all invariants hold). A write's
// sums are the one thing replicas take on trust from the leader, which
// computes them from the bytes it puts in the entry (a request that
// carries sums is refused, docs/dedup.md), so every sum that names a
// piece of data is made that piece's true hash first; their shape is
// fuzzed like everything else.
func FuzzApplyBytes(f *testing.F) {
	for i, e := range genLog(12, 30) {
		if i%3 == 0 {
			f.Add(ft.Marshal(e))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x01, 0x1a, 0x00})
	renew := ft.Entry(ft.Start+int64(time.Hour), inSession(1, 0, ft.KeepAlive()), ft.Tick())
	renew.RenewFirst = true
	f.Add(ft.Marshal(renew))
	f.Fuzz(func(t *testing.T, data []byte) {
		data = trueSums(data)
		m := fuzzFSM(t)
		res, err := m.ApplyBytes(1000, data)
		if err != nil {
			require.Nil(t, res)
			// Compare with a state that only saw an index go by.
			ref := fuzzFSM(t)
			ref.Apply(1000, &pb.Entry{})
			require.Equal(t, snapBytes(t, ref), snapBytes(t, m))
			return
		}
		require.NoError(t, m.CheckNames())
		snap := snapBytes(t, m)
		g, err2 := fsm.New(fsm.Config{MemoryLimit: genLimit})
		require.NoError(t, err2)
		require.NoError(t, g.Restore(bytes.NewReader(snap)), "state after the entry breaks an invariant")
		require.Equal(t, snap, snapBytes(t, g))
		require.NoError(t, g.CheckNames())
	})
}

// trueSums returns the entry in data with each 32-byte sum of a write
// replaced by the hash of the data piece it stands for, as a leader
// writes it; data that is not an entry, or has no sums, comes back as is.
func trueSums(data []byte) []byte {
	var e pb.Entry
	if proto.Unmarshal(data, &e) != nil {
		return data
	}
	fixed := false
	for _, c := range e.Commands {
		w := c.GetWrite()
		if w == nil || len(w.Sums) != len(w.Hashes) || w.Offset < 0 {
			continue
		}
		rest, end := w.Data, uint64(w.Offset)+w.Length
		for i, pos := 0, uint64(w.Offset); i < len(w.Hashes) && pos < end; i++ {
			next := min((pos/cs+1)*cs, end)
			if len(w.Hashes[i]) > 0 || uint64(len(rest)) < next-pos {
				pos = next
				continue
			}
			if len(w.Sums[i]) == block.HashSize {
				h := block.Sum(rest[:next-pos])
				w.Sums[i], fixed = h[:], true
			}
			rest, pos = rest[next-pos:], next
		}
	}
	if !fixed {
		return data
	}
	out, err := proto.Marshal(&e)
	if err != nil {
		return data
	}
	return out
}

// FuzzRestore feeds arbitrary bytes as a snapshot: it must never panic, a
// refused snapshot must leave the state alone, and an accepted one must
// write back identically.
// seedFSMs are the states the snapshot fuzzers start their corpus from.
func seedFSMs(f *testing.F) []*fsm.FSM {
	var out []*fsm.FSM
	for _, seed := range []uint64{11, 13} {
		m, err := fsm.New(fsm.Config{ChunkSize: cs})
		if err != nil {
			f.Fatal(err)
		}
		for i, e := range genLog(seed, 25) {
			m.Apply(uint64(i+1), e)
		}
		out = append(out, m)
	}
	return out
}

func FuzzRestore(f *testing.F) {
	for _, m := range seedFSMs(f) {
		var buf bytes.Buffer
		if _, err := m.Snapshot().WriteTo(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Add([]byte("MEMFSNAP\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRestore(t, data)
		if len(data) > 4 {
			// Fix the checksum too, so that mutations reach the records.
			fixed := bytes.Clone(data)
			body := fixed[:len(fixed)-4]
			binary.LittleEndian.PutUint32(fixed[len(body):], crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
			checkRestore(t, fixed)
		}
	})
}

func checkRestore(t *testing.T, data []byte) {
	m, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	m.Apply(1, ft.Entry(1, ft.Mkdir("/keep", 0o755)))
	before := snapBytes(t, m)
	if err := m.Restore(bytes.NewReader(data)); err != nil {
		require.Equal(t, before, snapBytes(t, m))
		return
	}
	require.NoError(t, m.CheckNames())
	snap := snapBytes(t, m)
	g := restored(t, snap)
	require.Equal(t, snap, snapBytes(t, g))
	// The restored state takes commands without falling over.
	for i, e := range fuzzAfter() {
		m.Apply(m.AppliedIndex()+uint64(i)+1, e)
	}
	require.NoError(t, m.CheckNames())
	restored(t, snapBytes(t, m))
}
