package fsm

import (
	"context"
	"fmt"
	"io"

	"github.com/memoryfs/memfs/fsm/block"
)

// BlockSink receives the blocks of a snapshot written with WriteExternal.
// PutBlock is called once per unique block, from the goroutine running
// WriteExternal; data is valid only during the call (it is the block's
// own memory, which another block may take once the call returns) and
// must be neither modified nor kept. A sink that
// already holds h should return at once: persisting then costs only what
// changed since the last snapshot.
type BlockSink interface {
	PutBlock(h block.Hash, data []byte) error
}

// BlockWant names a block a version 2 snapshot refers to but the restoring
// state machine does not hold. Ino, Index and FileSize describe the first
// chunk that refers to it, for a source that orders its work (small files
// first, say).
type BlockWant struct {
	Hash     block.Hash
	Size     uint64
	Ino      uint64
	Index    uint64
	FileSize uint64
}

// BlockSource supplies the blocks a restore lacks. Blocks returns every
// wanted block in block memory (block.NewBlock), each already checked
// against its hash (the state machine checks the hash and the length). It is called at most once per restore, from
// the restoring goroutine, and may take as long as ctx allows.
type BlockSource interface {
	Blocks(ctx context.Context, want []BlockWant) (map[block.Hash]*block.Block, error)
}

// RestoreFrom is Restore for a snapshot that may name blocks by hash
// (version 2). Blocks the current state already holds are shared with the
// new one; the rest come from src, in one call, after the whole stream has
// been read and its checksum checked. src may be nil when every block is
// inline or already held.
func (f *FSM) RestoreFrom(ctx context.Context, r io.Reader, src BlockSource) error {
	s, err := readSnapshot(ctx, r, f.cfg.MemoryLimit, f.cur.Load().blocks, src)
	if err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	f.publish(s)
	return nil
}

// extern writes one 'K' record and hands the block to sink the first time
// the stream names it.
func (sw *snapWriter) extern(sink BlockSink, written map[block.Hash]struct{}, rec []byte, b *block.Block) {
	h := b.Hash()
	if _, ok := written[h]; !ok {
		written[h] = struct{}{}
		var err error
		b.View(func(d []byte) { err = sink.PutBlock(h, d) }) // the sink must not keep d
		if err != nil {
			sw.err = fmt.Errorf("persist block %s: %w", h.Short(), err)
			return
		}
	}
	sw.record(recExtern, rec, nil)
}

// pendingChunk is a chunk whose block is not held yet.
type pendingChunk struct {
	key  []byte
	hash block.Hash
	size uint64
}

// externChunk reads a 'K' record: the block comes from the new state (an
// earlier chunk named it), the old state, or later from the source.
func (rs *restorer) externChunk(d *dec) error {
	s := rs.s
	ino, idx := d.uvarint(), d.uvarint()
	hb := d.take(block.HashSize)
	size := d.uvarint()
	if err := d.done(); err != nil {
		return err
	}
	h, _ := block.ParseHash(hb)
	switch {
	case rs.version != snapVersionExtern:
		return badSnap("block by hash in a version %d snapshot", rs.version)
	case size == 0 || size > s.chunkSize:
		return badSnap("block %s of %d bytes", h.Short(), size)
	}
	key := pairKey(ino, idx)
	if err := rs.inOrder(key); err != nil {
		return err
	}
	if b := s.blocks.Get(h); b != nil {
		return rs.adoptKnown(key, b, size)
	}
	if rs.old != nil {
		if b := rs.old.Get(h); b != nil {
			if uint64(b.Len()) != size {
				return badSnap("block %s: %d bytes, held %d", h.Short(), size, b.Len())
			}
			s.chunks.put(key, s.blocks.Share(b)) // immutable: shared, not copied
			return nil
		}
	}
	if w, ok := rs.wanted[h]; ok {
		if rs.wants[w].Size != size {
			return badSnap("block %s named with lengths %d and %d", h.Short(), rs.wants[w].Size, size)
		}
	} else {
		if rs.wanted == nil {
			rs.wanted = make(map[block.Hash]int)
		}
		var fileSize uint64
		if n := s.inode(ino); n != nil {
			fileSize = n.size
		}
		rs.wanted[h] = len(rs.wants)
		rs.wants = append(rs.wants, BlockWant{Hash: h, Size: size, Ino: ino, Index: idx, FileSize: fileSize})
	}
	rs.pending = append(rs.pending, pendingChunk{key: key, hash: h, size: size})
	return nil
}

func (rs *restorer) adoptKnown(key []byte, b *block.Block, size uint64) error {
	if uint64(b.Len()) != size {
		return badSnap("block %s named with lengths %d and %d", b.Hash().Short(), b.Len(), size)
	}
	rs.s.blocks.RefBlock(b)
	rs.s.chunks.put(key, b)
	return nil
}

// fetchPending asks the source for the blocks no one held and puts their
// chunks in place.
func (rs *restorer) fetchPending(ctx context.Context, src BlockSource) error {
	if len(rs.pending) == 0 {
		return nil
	}
	if src == nil {
		return badSnap("%d blocks named by hash and no source for them", len(rs.wants))
	}
	got, err := src.Blocks(ctx, rs.wants)
	if err != nil {
		return fmt.Errorf("fetch %d blocks: %w", len(rs.wants), err)
	}
	s := rs.s
	for _, p := range rs.pending {
		if b := s.blocks.Get(p.hash); b != nil {
			if err := rs.adoptKnown(p.key, b, p.size); err != nil {
				return err
			}
			continue
		}
		b, ok := got[p.hash]
		switch {
		case !ok || uint64(b.Len()) != p.size:
			return badSnap("block %s: source returned %d bytes (ok %v), want %d", p.hash.Short(), b.Len(), ok, p.size)
		case b.Hash() != p.hash:
			return badSnap("block %s: source returned block %s", p.hash.Short(), b.Hash().Short())
		}
		// Shared, not copied: the source put it in block memory. A later
		// chunk naming the same block finds it stored.
		s.chunks.put(p.key, s.blocks.Share(b))
	}
	return nil
}

// ScanBlocks reads a snapshot stream and calls fn for every block it names
// by hash ('K' records; once per record, so a shared block may come more
// than once). It checks the framing and the checksum, not the tree: it is
// for finding which stored blocks a kept snapshot still needs.
func ScanBlocks(r io.Reader, fn func(h block.Hash, size uint64)) error {
	sr := &snapReader{r: bufioReader(r)}
	if _, err := readMagic(sr); err != nil {
		return err
	}
	var scratch []byte
	for {
		var k [1]byte
		if err := sr.full(k[:]); err != nil {
			return err
		}
		n, err := sr.uvarint()
		if err != nil {
			return err
		}
		if n > maxRecord+16<<20 {
			return badSnap("record %q of %d bytes", k[0], n)
		}
		if uint64(cap(scratch)) < n {
			scratch = make([]byte, n)
		}
		p := scratch[:n]
		if err := sr.full(p); err != nil {
			return err
		}
		switch k[0] {
		case recEnd:
			return sr.checkSum()
		case recExtern:
			d := &dec{b: p}
			d.uvarint()
			d.uvarint()
			hb := d.take(block.HashSize)
			size := d.uvarint()
			if err := d.done(); err != nil {
				return err
			}
			h, _ := block.ParseHash(hb)
			fn(h, size)
		}
	}
}
