// Package blockdir is a node's persistent block store: immutable,
// content-addressed blocks appended to pack files in one directory and
// shared by all of the node's snapshots. A snapshot names blocks by hash;
// persisting one appends only the blocks not already here, so its cost
// follows what changed since the last one. Every read is checked against
// the block's hash, and a block that fails the check is dropped so it can
// be fetched again.
//
// It knows nothing of files, Raft or the network, and it never decides on
// its own which blocks are live: Retain is told.
package blockdir

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
)

// ErrCorrupt marks a block whose bytes on disk do not match its hash.
var ErrCorrupt = fmt.Errorf("block content does not match its hash: %w", syscall.EIO)

// Pack file layout: the magic, then records of
//
//	hash [32] | length uint32 LE | data [length]
//
// appended in order. A record cut off by a crash is cut from the file at
// the next Open.
const (
	packMagic  = "MFSPACK1"
	recHead    = block.HashSize + 4
	maxBlock   = 16 << 20
	packSuffix = ".pack"
)

// PackSize is the size past which a new pack file is started.
var PackSize int64 = 256 << 20

type loc struct {
	pack uint32
	off  int64 // of the record's data
	size uint32
}

type pack struct {
	f     *os.File
	end   int64 // bytes in the file
	live  int64 // bytes of live records' data
	dirty bool  // written since the last Sync
}

// Dir is a block directory. Its methods are safe for concurrent use.
type Dir struct {
	path string

	mu    sync.RWMutex // guards index and packs (the map and each pack's fields)
	index map[block.Hash]loc
	packs map[uint32]*pack

	wmu    sync.Mutex // serialises appends
	active uint32     // the pack appends go to; guarded by wmu
	newDir bool       // a pack file was created since the last Sync; guarded by wmu

	// gc excludes Retain while blocks are being written for a snapshot
	// that is not yet listed anywhere (Hold).
	gc sync.RWMutex

	bytes   atomic.Uint64
	written atomic.Uint64
	corrupt atomic.Uint64
}

// Stats describe the directory.
type Stats struct {
	Blocks    uint64
	Bytes     uint64 // bytes of the blocks held
	PackBytes uint64 // bytes of the pack files (held blocks, headers, space not yet reclaimed)
	Written   uint64 // block bytes written since Open
	Corrupt   uint64 // blocks found corrupt since Open
}

// Open opens (creating it if need be) the block directory at path and
// indexes the packs in it.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("blockdir: %w", err)
	}
	d := &Dir{path: path, index: map[block.Hash]loc{}, packs: map[uint32]*pack{}}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("blockdir: %w", err)
	}
	for _, e := range ents {
		id, ok := packID(e.Name())
		if !ok {
			continue
		}
		if err := d.load(id); err != nil {
			d.Close()
			return nil, err
		}
		d.active = max(d.active, id)
	}
	return d, nil
}

func packID(name string) (uint32, bool) {
	s, ok := strings.CutSuffix(name, packSuffix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil && n > 0
}

func (d *Dir) packPath(id uint32) string {
	return filepath.Join(d.path, fmt.Sprintf("%08d%s", id, packSuffix))
}

// load indexes one pack, cutting a torn tail.
func (d *Dir) load(id uint32) error {
	f, err := os.OpenFile(d.packPath(id), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("blockdir: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("blockdir: %w", err)
	}
	p := &pack{f: f, end: st.Size()}
	d.packs[id] = p
	magic := make([]byte, len(packMagic))
	if _, err := f.ReadAt(magic, 0); err != nil || string(magic) != packMagic {
		return fmt.Errorf("blockdir: %s is not a pack file", f.Name())
	}
	off := int64(len(packMagic))
	var head [recHead]byte
	for off < p.end {
		n, _ := f.ReadAt(head[:], off)
		size := binary.LittleEndian.Uint32(head[block.HashSize:])
		if n < recHead || size == 0 || size > maxBlock || off+recHead+int64(size) > p.end {
			break // a record cut off by a crash
		}
		h, _ := block.ParseHash(head[:block.HashSize])
		d.add(h, loc{pack: id, off: off + recHead, size: size})
		off += recHead + int64(size)
	}
	if off < p.end {
		if err := f.Truncate(off); err != nil {
			return fmt.Errorf("blockdir: cut torn tail of %s: %w", f.Name(), err)
		}
		p.end = off
	}
	return nil
}

// add indexes a record; a later copy of a block replaces an earlier one.
// Caller holds mu (or owns d alone).
func (d *Dir) add(h block.Hash, l loc) {
	if old, ok := d.index[h]; ok {
		d.packs[old.pack].live -= int64(old.size)
		d.bytes.Add(-uint64(old.size))
	}
	d.index[h] = l
	d.packs[l.pack].live += int64(l.size)
	d.bytes.Add(uint64(l.size))
}

func (d *Dir) drop(h block.Hash) {
	if l, ok := d.index[h]; ok {
		delete(d.index, h)
		d.packs[l.pack].live -= int64(l.size)
		d.bytes.Add(-uint64(l.size))
	}
}

// Has reports whether block h is on disk.
func (d *Dir) Has(h block.Hash) bool {
	d.mu.RLock()
	_, ok := d.index[h]
	d.mu.RUnlock()
	return ok
}

// PutBlock appends block h unless it is already here. The caller vouches
// that h is the hash of data. Nothing is durable before Sync.
func (d *Dir) PutBlock(h block.Hash, data []byte) error {
	if len(data) == 0 || len(data) > maxBlock {
		return fmt.Errorf("blockdir: block of %d bytes: %w", len(data), syscall.EINVAL)
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.Has(h) {
		return nil
	}
	return d.appendLocked(h, data)
}

// appendLocked writes one record to the active pack. Caller holds wmu.
func (d *Dir) appendLocked(h block.Hash, data []byte) error {
	p, err := d.activePack(int64(recHead + len(data)))
	if err != nil {
		return err
	}
	var head [recHead]byte
	copy(head[:], h[:])
	binary.LittleEndian.PutUint32(head[block.HashSize:], uint32(len(data)))
	off := p.end
	if _, err := p.f.WriteAt(head[:], off); err != nil {
		return fmt.Errorf("blockdir: append %s: %w", h.Short(), err)
	}
	if _, err := p.f.WriteAt(data, off+recHead); err != nil {
		return fmt.Errorf("blockdir: append %s: %w", h.Short(), err)
	}
	d.mu.Lock()
	p.end = off + recHead + int64(len(data))
	p.dirty = true
	d.add(h, loc{pack: d.active, off: off + recHead, size: uint32(len(data))})
	d.mu.Unlock()
	d.written.Add(uint64(len(data)))
	return nil
}

// activePack returns the pack to append n bytes to, starting a new one
// when the current one is full. Caller holds wmu.
func (d *Dir) activePack(n int64) (*pack, error) {
	d.mu.RLock()
	p := d.packs[d.active]
	d.mu.RUnlock()
	if p != nil && p.end+n <= max(PackSize, int64(len(packMagic))+n) {
		return p, nil
	}
	id := d.active + 1
	f, err := os.OpenFile(d.packPath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("blockdir: new pack: %w", err)
	}
	if _, err := f.WriteAt([]byte(packMagic), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("blockdir: new pack: %w", err)
	}
	p = &pack{f: f, end: int64(len(packMagic)), dirty: true}
	d.mu.Lock()
	d.packs[id] = p
	d.mu.Unlock()
	d.active, d.newDir = id, true
	return p, nil
}

// Get reads block h and checks it against its hash. A missing block is
// fs.ErrNotExist; a corrupt one is dropped and reported as ErrCorrupt.
func (d *Dir) Get(h block.Hash) ([]byte, error) {
	d.mu.RLock()
	l, ok := d.index[h]
	var data []byte
	var err error
	if ok {
		data = make([]byte, l.size)
		_, err = d.packs[l.pack].f.ReadAt(data, l.off)
	}
	d.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("blockdir: block %s: %w", h.Short(), fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("blockdir: read %s: %w", h.Short(), err)
	}
	if block.Sum(data) != h {
		d.corrupt.Add(1)
		d.mu.Lock()
		if d.index[h] == l {
			d.drop(h)
		}
		d.mu.Unlock()
		return nil, fmt.Errorf("blockdir: block %s: %w", h.Short(), ErrCorrupt)
	}
	return data, nil
}

// Sync makes every block appended so far durable: an fsync of each pack
// written to, and of the directory when a pack was created.
func (d *Dir) Sync() error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	return d.syncLocked()
}

// syncLocked is Sync for a caller holding wmu.
func (d *Dir) syncLocked() error {
	d.mu.RLock()
	var dirty []*pack
	for _, p := range d.packs {
		if p.dirty {
			dirty = append(dirty, p)
		}
	}
	d.mu.RUnlock()
	for _, p := range dirty {
		if err := p.f.Sync(); err != nil {
			return fmt.Errorf("blockdir: sync %s: %w", p.f.Name(), err)
		}
		d.mu.Lock()
		p.dirty = false
		d.mu.Unlock()
	}
	if d.newDir {
		if err := syncDir(d.path); err != nil {
			return err
		}
		d.newDir = false
	}
	return nil
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("blockdir: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blockdir: sync %s: %w", path, err)
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

// Retain drops every block that the live set does not name and returns
// how many it dropped. It waits for holders to finish and then computes
// the live set (liveSet) while no one can write blocks for a snapshot that
// liveSet would not see yet. Packs left with no live block are deleted;
// packs less than half live are compacted into the active pack.
func (d *Dir) Retain(liveSet func() (func(block.Hash) bool, error)) (int, error) {
	d.gc.Lock()
	defer d.gc.Unlock()
	live, err := liveSet()
	if err != nil {
		return 0, fmt.Errorf("blockdir: live set: %w", err)
	}
	d.mu.Lock()
	dropped := 0
	for h := range d.index {
		if !live(h) {
			d.drop(h)
			dropped++
		}
	}
	d.mu.Unlock()
	return dropped, d.reclaim()
}

// reclaim deletes empty packs and compacts sparse ones (never the active
// one). Caller holds gc exclusively.
func (d *Dir) reclaim() error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.mu.RLock()
	var ids []uint32
	for id, p := range d.packs {
		if id != d.active && p.live*2 < p.end {
			ids = append(ids, id)
		}
	}
	d.mu.RUnlock()
	slices.Sort(ids)
	var errs []error
	for _, id := range ids {
		errs = append(errs, d.compact(id))
	}
	return errors.Join(errs...)
}

// compact moves pack id's live blocks to the active pack, makes them
// durable, and deletes the pack. Caller holds gc and wmu.
func (d *Dir) compact(id uint32) error {
	d.mu.RLock()
	var move []block.Hash
	for h, l := range d.index {
		if l.pack == id {
			move = append(move, h)
		}
	}
	d.mu.RUnlock()
	for _, h := range move {
		data, err := d.Get(h) // a corrupt block is dropped, not moved
		if errors.Is(err, ErrCorrupt) {
			continue
		}
		if err != nil {
			return err
		}
		if err := d.appendLocked(h, data); err != nil {
			return err
		}
	}
	if len(move) > 0 {
		if err := d.syncLocked(); err != nil {
			return err
		}
	}
	d.mu.Lock()
	p := d.packs[id]
	delete(d.packs, id)
	d.mu.Unlock()
	p.f.Close()
	if err := os.Remove(d.packPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blockdir: %w", err)
	}
	return nil
}

// Stats returns the directory's totals.
func (d *Dir) Stats() Stats {
	d.mu.RLock()
	n := len(d.index)
	var packBytes int64
	for _, p := range d.packs {
		packBytes += p.end
	}
	d.mu.RUnlock()
	return Stats{Blocks: uint64(n), Bytes: d.bytes.Load(), PackBytes: uint64(packBytes),
		Written: d.written.Load(), Corrupt: d.corrupt.Load()}
}

// Path is the directory's location.
func (d *Dir) Path() string { return d.path }

// Close closes the pack files once no snapshot holds the directory and no
// collection runs.
func (d *Dir) Close() error {
	d.gc.Lock()
	defer d.gc.Unlock()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, p := range d.packs {
		errs = append(errs, p.f.Close())
	}
	d.packs = map[uint32]*pack{}
	d.index = map[block.Hash]loc{}
	return errors.Join(errs...)
}

var _ io.Closer = (*Dir)(nil)
