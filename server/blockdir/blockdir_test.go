package blockdir_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm/block"
	"github.com/memoryfs/memfs/server/blockdir"
)

func open(t *testing.T, path string) *blockdir.Dir {
	t.Helper()
	d, err := blockdir.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func put(t *testing.T, d *blockdir.Dir, data []byte) block.Hash {
	t.Helper()
	h := block.Sum(data)
	require.NoError(t, d.PutBlock(h, data))
	require.NoError(t, d.Sync())
	return h
}

func packs(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(path, "*.pack"))
	require.NoError(t, err)
	return m
}

func TestPutGetReopen(t *testing.T) {
	path := t.TempDir()
	d := open(t, path)
	a := put(t, d, []byte("alpha"))
	b := put(t, d, bytes.Repeat([]byte{7}, 4096))
	put(t, d, []byte("alpha")) // again: not written twice
	require.Equal(t, uint64(5+4096), d.Stats().Written)
	require.NoError(t, d.Close())

	d2 := open(t, path)
	require.Equal(t, uint64(2), d2.Stats().Blocks)
	require.Equal(t, uint64(5+4096), d2.Stats().Bytes)
	got, err := d2.Get(a)
	require.NoError(t, err)
	require.Equal(t, []byte("alpha"), got)
	require.True(t, d2.Has(b))
	_, err = d2.Get(block.Sum([]byte("never stored")))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestTornTailIsCut(t *testing.T) {
	path := t.TempDir()
	d := open(t, path)
	a := put(t, d, []byte("whole record"))
	b := put(t, d, bytes.Repeat([]byte{9}, 1000))
	require.NoError(t, d.Close())
	p := packs(t, path)[0]
	st, err := os.Stat(p)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(p, st.Size()-10)) // a crash in the middle of b

	d2 := open(t, path)
	require.True(t, d2.Has(a))
	require.False(t, d2.Has(b))
	put(t, d2, bytes.Repeat([]byte{9}, 1000)) // appended after the cut
	require.NoError(t, d2.Close())
	d3 := open(t, path)
	got, err := d3.Get(b)
	require.NoError(t, err)
	require.Len(t, got, 1000)
}

func TestCorruptBlockIsDropped(t *testing.T) {
	path := t.TempDir()
	d := open(t, path)
	h := put(t, d, []byte("precious bytes"))
	p := packs(t, path)[0]
	raw, err := os.ReadFile(p)
	require.NoError(t, err)
	i := bytes.Index(raw, []byte("precious"))
	raw[i] ^= 1
	require.NoError(t, os.WriteFile(p, raw, 0o600))

	_, err = d.Get(h)
	require.ErrorIs(t, err, blockdir.ErrCorrupt)
	require.False(t, d.Has(h), "a corrupt block is dropped so it can be fetched again")
	require.Equal(t, uint64(1), d.Stats().Corrupt)
	put(t, d, []byte("precious bytes"))
	got, err := d.Get(h)
	require.NoError(t, err)
	require.Equal(t, []byte("precious bytes"), got)
	require.NoError(t, d.Close())
	d2 := open(t, path) // the good copy, appended later, wins
	got, err = d2.Get(h)
	require.NoError(t, err)
	require.Equal(t, []byte("precious bytes"), got)
}

func TestRetainReclaimsPacks(t *testing.T) {
	old := blockdir.PackSize
	blockdir.PackSize = 3000 // a pack per two blocks
	t.Cleanup(func() { blockdir.PackSize = old })
	path := t.TempDir()
	d := open(t, path)
	var keep, drop []block.Hash
	for i := range 8 {
		h := put(t, d, bytes.Repeat([]byte{byte(i)}, 1000))
		if i%4 == 0 {
			keep = append(keep, h)
		} else {
			drop = append(drop, h)
		}
	}
	before := len(packs(t, path))
	release := d.Hold()
	done := make(chan int)
	go func() {
		n, err := d.Retain(func() (func(block.Hash) bool, error) {
			return func(h block.Hash) bool { return h == keep[0] || h == keep[1] }, nil
		})
		require.NoError(t, err)
		done <- n
	}()
	time.Sleep(50 * time.Millisecond) // give Retain the chance to run too early
	select {
	case <-done:
		t.Fatal("Retain ran while a snapshot held the directory")
	default:
	}
	release()
	require.Equal(t, 6, <-done)
	for _, h := range keep {
		got, err := d.Get(h)
		require.NoError(t, err)
		require.Len(t, got, 1000)
	}
	for _, h := range drop {
		require.False(t, d.Has(h))
	}
	require.Less(t, len(packs(t, path)), before, "empty and sparse packs are reclaimed")
	require.Less(t, d.Stats().PackBytes, uint64(5000))
	require.NoError(t, d.Close())
	// Reopened: the kept blocks are there, the reclaimed packs' are gone;
	// dropped records in the pack still being written come back as garbage
	// until the next Retain (the directory records no deletions).
	d2 := open(t, path)
	for _, h := range keep {
		require.True(t, d2.Has(h))
	}
	require.Less(t, d2.Stats().Blocks, uint64(8))
}

func TestBadBlockSizeRefused(t *testing.T) {
	d := open(t, t.TempDir())
	require.Error(t, d.PutBlock(block.Sum(nil), nil))
}
