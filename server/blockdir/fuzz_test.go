package blockdir_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/memoryfs/memfs/fsm/block"
	"github.com/memoryfs/memfs/server/blockdir"
)

// FuzzOpenPack opens a block directory whose pack holds arbitrary bytes,
// as a node does at start with what a crash or a bad disk left: Open
// either refuses the file or indexes what it can, every block it then
// serves matches its hash, and a block put afterwards reads back after a
// reopen.
func FuzzOpenPack(f *testing.F) {
	dir := f.TempDir()
	d, err := blockdir.Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, b := range [][]byte{[]byte("alpha"), bytes.Repeat([]byte{7}, 300), []byte("omega")} {
		if err := d.PutBlock(block.Sum(b), b); err != nil {
			f.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		f.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*.pack"))
	if len(m) != 1 {
		f.Fatalf("packs: %v", m)
	}
	valid, err := os.ReadFile(m[0])
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:len(valid)-3])
	f.Add(valid[:8])
	f.Add([]byte("MFSPACK1\xff\xff\xff\xff"))
	f.Add([]byte("garbage"))

	f.Fuzz(func(t *testing.T, pack []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "00000001.pack"), pack, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := blockdir.Open(dir)
		if err != nil {
			return // not a pack: refused
		}
		if st := d.Stats(); st.Bytes > uint64(len(pack)) {
			t.Fatalf("indexed %d bytes of a %d-byte file", st.Bytes, len(pack))
		}
		// Any block whose hash sits in the file: served only intact.
		for off := 0; off+block.HashSize <= len(pack) && off < 4096; off++ {
			h, err := block.ParseHash(pack[off : off+block.HashSize])
			if err != nil || !d.Has(h) {
				continue
			}
			got, err := d.Get(h)
			if err == nil && block.Sum(got) != h {
				t.Fatalf("block %s served with other bytes", h.Short())
			}
			if err != nil && !errors.Is(err, blockdir.ErrCorrupt) && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("get %s: %v", h.Short(), err)
			}
		}
		fresh := []byte("appended after whatever was there")
		h := block.Sum(fresh)
		if err := d.PutBlock(h, fresh); err != nil {
			t.Fatalf("put after open: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		d2, err := blockdir.Open(dir)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer d2.Close()
		got, err := d2.Get(h)
		if err != nil || !bytes.Equal(got, fresh) {
			t.Fatalf("block put after open, after reopen: %q, %v", got, err)
		}
	})
}
