package fsm_test

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// TestConcurrentReaders runs queries and snapshots while Apply goes on
// (meaningful under -race), and checks that a snapshot taken at index i
// restores to exactly the state a replay of the first i entries gives.
func TestConcurrentReaders(t *testing.T) {
	log := genLog(21, 1500)
	f, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
	require.NoError(t, err)
	var done atomic.Bool
	var wg sync.WaitGroup
	queries := []func(p string) *pb.Query{
		ft.Stat, ft.Lstat, ft.Readlink, ft.ListXattr, ft.Usage,
		func(p string) *pb.Query { return ft.Read(p, 0, 3*cs) },
		func(p string) *pb.Query { return ft.ReadDir(p, "", 3) },
		func(string) *pb.Query { return ft.Statfs() },
	}
	for r := range 2 {
		wg.Go(func() {
			g := newLogGen(uint64(100 + r))
			for i := 0; !done.Load(); i++ {
				res := f.Query(queries[i%len(queries)](g.path()))
				require.NotNil(t, res)
				_ = f.Stats()
			}
		})
	}
	type snap struct {
		index uint64
		data  []byte
	}
	var snaps []snap
	wg.Go(func() {
		for !done.Load() {
			s := f.Snapshot()
			var buf bytes.Buffer
			_, err := s.WriteTo(io.MultiWriter(&buf, io.Discard))
			require.NoError(t, err)
			if len(snaps) < 5 {
				snaps = append(snaps, snap{s.Index(), buf.Bytes()})
			}
		}
	})
	for i, e := range log {
		f.Apply(uint64(i+1), e)
	}
	done.Store(true)
	wg.Wait()
	require.NotEmpty(t, snaps)
	for _, s := range snaps {
		replay, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
		require.NoError(t, err)
		for i, e := range log[:s.index] {
			replay.Apply(uint64(i+1), e)
		}
		require.Equal(t, snapBytes(t, replay), s.data, "snapshot at index %d", s.index)
	}
}
