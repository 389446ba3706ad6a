// Package blockdir is a node's persistent block store: a directory of
// immutable, content-addressed block files shared by all of the node's
// snapshots. A snapshot names blocks by hash; persisting one writes only
// the blocks not already here, so its cost follows what changed since the
// last one. Every read is checked against the block's hash, and a block
// that fails the check is removed so it can be fetched again.
//
// It knows nothing of files, Raft or the network, and it never decides on
// its own which blocks are live: Retain is told.
package blockdir

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/memoryfs/memfs/fsm/block"
)

// ErrCorrupt marks a block whose bytes on disk do not match its hash.
var ErrCorrupt = fmt.Errorf("block content does not match its hash: %w", syscall.EIO)

// Dir is a block directory. Its methods are safe for concurrent use.
type Dir struct {
	path string

	mu    sync.RWMutex
	index map[block.Hash]uint32 // hash -> size of every block on disk

	// gc excludes Retain while blocks are being written for a snapshot
	// that is not yet listed anywhere (Hold).
	gc sync.RWMutex

	// Writes run on up to `writers` goroutines (file creation, not the
	// disk, is what a block costs); Sync waits for them and reports the
	// first error.
	slots    chan struct{}
	writing  map[block.Hash]struct{} // guarded by mu
	inflight sync.WaitGroup
	errMu    sync.Mutex
	err      error // first write error since the last Sync; guarded by errMu

	bytes   atomic.Uint64
	written atomic.Uint64
	corrupt atomic.Uint64
}

// Stats describe the directory.
type Stats struct {
	Blocks  uint64
	Bytes   uint64
	Written uint64 // bytes written since Open
	Corrupt uint64 // blocks found corrupt since Open
}

// Open opens (creating it if need be) the block directory at path and
// indexes the blocks in it. Files left half-written by a crash are removed.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("blockdir: %w", err)
	}
	d := &Dir{path: path, index: map[block.Hash]uint32{}, slots: make(chan struct{}, writers),
		writing: map[block.Hash]struct{}{}}
	for i := range 256 {
		if err := os.MkdirAll(filepath.Join(path, fmt.Sprintf("%02x", i)), 0o700); err != nil {
			return nil, fmt.Errorf("blockdir: %w", err)
		}
	}
	err := filepath.WalkDir(path, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		if strings.HasSuffix(p, ".tmp") {
			return os.Remove(p)
		}
		h, ok := parseName(e.Name())
		info, ierr := e.Info()
		if !ok || ierr != nil {
			return nil // not ours: leave it
		}
		d.index[h] = uint32(info.Size())
		d.bytes.Add(uint64(info.Size()))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("blockdir: index %s: %w", path, err)
	}
	return d, nil
}

func parseName(name string) (block.Hash, bool) {
	b, err := hex.DecodeString(name)
	if err != nil {
		return block.Hash{}, false
	}
	h, err := block.ParseHash(b)
	return h, err == nil
}

// file is where block h lives: one directory per first byte keeps
// directories small.
func (d *Dir) file(h block.Hash) string {
	s := hex.EncodeToString(h[:])
	return filepath.Join(d.path, s[:2], s)
}

// Has reports whether block h is on disk.
func (d *Dir) Has(h block.Hash) bool {
	d.mu.RLock()
	_, ok := d.index[h]
	d.mu.RUnlock()
	return ok
}

// writers is how many block files are written at once.
const writers = 4

// PutBlock writes block h unless it is already here, in the background:
// data must not change afterwards (blocks are immutable). The caller
// vouches that h is the hash of data. Nothing is durable, or reported,
// before Sync.
func (d *Dir) PutBlock(h block.Hash, data []byte) error {
	d.mu.Lock()
	_, have := d.index[h]
	_, busy := d.writing[h]
	if have || busy {
		d.mu.Unlock()
		return nil
	}
	d.writing[h] = struct{}{}
	d.mu.Unlock()
	d.slots <- struct{}{}
	d.inflight.Add(1)
	go func() {
		defer d.inflight.Done()
		err := d.write(h, data)
		<-d.slots
		d.mu.Lock()
		delete(d.writing, h)
		if err == nil {
			d.index[h] = uint32(len(data))
			d.bytes.Add(uint64(len(data)))
		}
		d.mu.Unlock()
		if err != nil {
			d.errMu.Lock()
			d.err = cmp.Or(d.err, err)
			d.errMu.Unlock()
			return
		}
		d.written.Add(uint64(len(data)))
	}()
	return nil
}

// write puts one block file in place through a temporary name, so a crash
// never leaves a partial file under a block's name.
func (d *Dir) write(h block.Hash, data []byte) error {
	name := d.file(h)
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("blockdir: write %s: %w", h.Short(), err)
	}
	if err := os.Rename(tmp, name); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("blockdir: %w", err)
	}
	return nil
}

// Get reads block h and checks it against its hash. A missing block is
// fs.ErrNotExist; a corrupt one is removed and reported as ErrCorrupt.
func (d *Dir) Get(h block.Hash) ([]byte, error) {
	if !d.Has(h) {
		return nil, fmt.Errorf("blockdir: block %s: %w", h.Short(), fs.ErrNotExist)
	}
	data, err := os.ReadFile(d.file(h))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			d.forget(h)
		}
		return nil, fmt.Errorf("blockdir: %w", err)
	}
	if block.Sum(data) != h {
		d.corrupt.Add(1)
		d.remove(h)
		return nil, fmt.Errorf("blockdir: block %s: %w", h.Short(), ErrCorrupt)
	}
	return data, nil
}

// Sync waits for the blocks being written, then makes every block written
// so far durable (one syncfs for all). It returns the first write error
// since the last Sync.
func (d *Dir) Sync() error {
	d.inflight.Wait()
	d.errMu.Lock()
	werr := d.err
	d.err = nil
	d.errMu.Unlock()
	if werr != nil {
		return werr
	}
	f, err := os.Open(d.path)
	if err != nil {
		return fmt.Errorf("blockdir: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("blockdir: syncfs: %w", err)
	}
	return nil
}

// Hold keeps Retain from running until the returned release is called:
// a snapshot being persisted or restored holds it while it writes blocks
// that no listed snapshot names yet.
func (d *Dir) Hold() (release func()) {
	d.gc.RLock()
	return d.gc.RUnlock
}

// Retain removes every block that the live set does not name and returns
// how many it removed. It waits for holders to finish and then computes
// the live set (liveSet) while no one can write blocks for a snapshot that
// liveSet would not see yet.
func (d *Dir) Retain(liveSet func() (func(block.Hash) bool, error)) (int, error) {
	d.gc.Lock()
	defer d.gc.Unlock()
	live, err := liveSet()
	if err != nil {
		return 0, fmt.Errorf("blockdir: live set: %w", err)
	}
	d.mu.RLock()
	var dead []block.Hash
	for h := range d.index {
		if !live(h) {
			dead = append(dead, h)
		}
	}
	d.mu.RUnlock()
	var errs []error
	for _, h := range dead {
		if err := d.remove(h); err != nil {
			errs = append(errs, err)
		}
	}
	return len(dead), errors.Join(errs...)
}

func (d *Dir) remove(h block.Hash) error {
	d.forget(h)
	if err := os.Remove(d.file(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blockdir: %w", err)
	}
	return nil
}

func (d *Dir) forget(h block.Hash) {
	d.mu.Lock()
	if n, ok := d.index[h]; ok {
		delete(d.index, h)
		d.bytes.Add(-uint64(n))
	}
	d.mu.Unlock()
}

// Stats returns the directory's totals.
func (d *Dir) Stats() Stats {
	d.mu.RLock()
	n := len(d.index)
	d.mu.RUnlock()
	return Stats{Blocks: uint64(n), Bytes: d.bytes.Load(), Written: d.written.Load(), Corrupt: d.corrupt.Load()}
}

// Path is the directory's location.
func (d *Dir) Path() string { return d.path }
