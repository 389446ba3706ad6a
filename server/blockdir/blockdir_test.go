package blockdir_test

import (
	"bytes"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm/block"
	"github.com/memoryfs/memfs/server/blockdir"
)

func put(t *testing.T, d *blockdir.Dir, data []byte) block.Hash {
	t.Helper()
	h := block.Sum(data)
	require.NoError(t, d.PutBlock(h, data))
	require.NoError(t, d.Sync(), "writes land by Sync")
	return h
}

func TestPutGetReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blocks")
	d, err := blockdir.Open(path)
	require.NoError(t, err)
	a := put(t, d, []byte("alpha"))
	b := put(t, d, bytes.Repeat([]byte{7}, 4096))
	put(t, d, []byte("alpha")) // again: not written twice
	require.Equal(t, uint64(5+4096), d.Stats().Written)
	require.NoError(t, d.Sync())

	// A crash mid-write leaves a .tmp file; reopening drops it.
	require.NoError(t, os.WriteFile(filepath.Join(path, "junk.tmp"), []byte("x"), 0o600))
	d2, err := blockdir.Open(path)
	require.NoError(t, err)
	require.Equal(t, blockdir.Stats{Blocks: 2, Bytes: 5 + 4096}, d2.Stats())
	got, err := d2.Get(a)
	require.NoError(t, err)
	require.Equal(t, []byte("alpha"), got)
	require.True(t, d2.Has(b))
	_, err = d2.Get(block.Sum([]byte("never stored")))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.NoFileExists(t, filepath.Join(path, "junk.tmp"))
}

func TestCorruptBlockIsRemoved(t *testing.T) {
	path := t.TempDir()
	d, err := blockdir.Open(path)
	require.NoError(t, err)
	h := put(t, d, []byte("precious bytes"))
	var file string
	require.NoError(t, filepath.WalkDir(path, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			file = p
		}
		return err
	}))
	require.NoError(t, os.WriteFile(file, []byte("precious bytez"), 0o600))
	_, err = d.Get(h)
	require.ErrorIs(t, err, blockdir.ErrCorrupt)
	require.False(t, d.Has(h), "a corrupt block is dropped so it can be fetched again")
	require.NoFileExists(t, file)
	require.Equal(t, uint64(1), d.Stats().Corrupt)
	put(t, d, []byte("precious bytes"))
	got, err := d.Get(h)
	require.NoError(t, err)
	require.Equal(t, []byte("precious bytes"), got)
}

func TestRetain(t *testing.T) {
	d, err := blockdir.Open(t.TempDir())
	require.NoError(t, err)
	keep := put(t, d, []byte("keep"))
	drop := put(t, d, []byte("drop"))
	release := d.Hold()
	done := make(chan int)
	go func() {
		n, err := d.Retain(func() (func(block.Hash) bool, error) {
			return func(h block.Hash) bool { return h == keep }, nil
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
	require.Equal(t, 1, <-done)
	require.True(t, d.Has(keep))
	require.False(t, d.Has(drop))
	require.Equal(t, uint64(4), d.Stats().Bytes)
}

func TestWriteErrorSurfacesAtSync(t *testing.T) {
	path := t.TempDir()
	d, err := blockdir.Open(path)
	require.NoError(t, err)
	data := []byte("cannot land")
	h := block.Sum(data)
	shard := filepath.Join(path, hex.EncodeToString(h[:1]))
	require.NoError(t, os.RemoveAll(shard))
	require.NoError(t, os.WriteFile(shard, nil, 0o600)) // a file where the shard directory should be
	require.NoError(t, d.PutBlock(h, data))
	require.Error(t, d.Sync())
	require.False(t, d.Has(h))
	require.NoError(t, d.Sync(), "the error is reported once")
}
