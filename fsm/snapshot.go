package fsm

import (
	"encoding/binary"
	"hash/crc32"
	"io"

	"github.com/memoryfs/memfs/fsm/block"
	"google.golang.org/protobuf/proto"
)

// Snapshot stream format (versions 1 and 2). Everything is written in tree
// key order, so the same state always gives the same bytes. Version 1
// carries block bytes inline ('B', 'R'); version 2 (WriteExternal) carries
// only each chunk's hash and length ('K') and hands the bytes to a
// BlockSink, so a snapshot of a large state is small and blocks already
// persisted are not written again.
//
//	magic "MEMFSNAP", uvarint version
//	records: kind byte, uvarint payload length, payload
//	  'H' header (first): chunk size, index, time, next inode/handle/session, inode count
//	  'T' token: hash, role, name, created, expires, then its path when
//	      it has one
//	  'S' session (its inode reservations, when it has any or an owner,
//	      then its owner, when it has one, at the end),
//	  'F' handle, 'L' exclusive-open state, 'C' capability (with flag
//	      capLeech its leecher and readiness after the flags, with
//	      capReport the chunks its handoff reported changed after those;
//	      its tenure at the end, absent when it equals the epoch),
//	  'P' the file locks of one inode: the locks held, then the waiters
//	  'U' recorded result
//	  'I' inode (its parent 0 unless a directory: a file's directories
//	      come from the entries; earlier versions may have written one),
//	  'D' directory entry
//	  'B' chunk with its block's bytes (the block's first reference)
//	  'R' chunk naming a block already written, by hash
//	  'K' chunk naming a block kept outside the stream: hash and length
//	      (version 2 only; every chunk of a version 2 stream is a 'K')
//	  'E' end: the number of records before it
//	CRC-32C (Castagnoli) of all bytes before it, 4 bytes little-endian
//
// Numbers are uvarints, times and signed values varints, strings and byte
// strings a uvarint length and the bytes; recorded results are protobuf
// (deterministic marshalling).
const (
	snapMagic         = "MEMFSNAP"
	snapVersion       = 1 // block bytes inline
	snapVersionExtern = 2 // blocks by hash only

	recHeader  = 'H'
	recToken   = 'T'
	recSession = 'S'
	recHandle  = 'F'
	recLock    = 'L'
	recCap     = 'C'
	recFLocks  = 'P'
	recDup     = 'U'
	recInode   = 'I'
	recDirent  = 'D'
	recBlock   = 'B'
	recRef     = 'R'
	recExtern  = 'K'
	recEnd     = 'E'

	maxRecord = 4 << 20 // any record but a block's

	capExcl  = 1 // flag of a 'C' record: the capability is exclusive
	capLeech = 2 // flag of a 'C' record: a leecher (and its readiness) follows the flags
	// capReport: flag of a 'C' record: the chunks its handoff reported
	// changed follow (after the leecher): their count, then each one's
	// distance from the one before (the first's from 0).
	capReport = 4

	// Flags of a lock in a 'P' record.
	lockWrite = 1
	lockBSD   = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type snapshot struct{ s *state }

// Snapshot captures the current state in O(1): the published state is
// immutable, and blocks never change, so WriteTo can run while Apply goes
// on.
func (f *FSM) Snapshot() Snapshot { return &snapshot{s: f.cur.Load()} }

// Index is the log index the snapshot reflects.
func (sn *snapshot) Index() uint64 { return sn.s.index }

// WriteTo streams the snapshot. Each unique block's bytes are written
// once, at its first reference.
func (sn *snapshot) WriteTo(w io.Writer) (int64, error) {
	return sn.write(w, nil)
}

// WriteExternal streams the snapshot with every chunk by hash and length,
// and hands each unique block to sink once (a sink that already holds a
// block skips it: that is what makes snapshots incremental).
func (sn *snapshot) WriteExternal(w io.Writer, sink BlockSink) (int64, error) {
	return sn.write(w, sink)
}

func (sn *snapshot) write(w io.Writer, sink BlockSink) (int64, error) {
	sw := &snapWriter{w: w, buf: make([]byte, 0, 1<<20)}
	sw.raw([]byte(snapMagic))
	version := uint64(snapVersion)
	if sink != nil {
		version = snapVersionExtern
	}
	sw.raw(binary.AppendUvarint(nil, version))
	sn.records(sw, sink)
	sw.record(recEnd, binary.AppendUvarint(nil, sw.records), nil)
	sw.flush()
	if sw.err == nil {
		var c [4]byte
		binary.LittleEndian.PutUint32(c[:], sw.crc)
		sw.write(c[:])
	}
	return sw.n, sw.err
}

func (sn *snapshot) records(sw *snapWriter, sink BlockSink) {
	s := sn.s
	var e enc
	e.uvarint(s.chunkSize).uvarint(s.index).varint(s.now).uvarint(s.nextIno).uvarint(s.nextHandle).uvarint(s.nextSession).uvarint(s.ninodes)
	sw.record(recHeader, e.b, nil)
	s.tokens.root().Walk(func(_ []byte, k *token) bool {
		e.reset().bytes(k.hash[:]).uvarint(uint64(k.role)).str(k.name).varint(k.created).varint(k.expires)
		if k.path != "" {
			e.str(k.path) // absent when empty: what earlier versions wrote
		}
		sw.record(recToken, e.b, nil)
		return sw.err != nil
	})
	s.sessions.root().Walk(func(_ []byte, x *session) bool {
		e.reset().uvarint(x.id).varint(x.leaseMs).varint(x.expires).str(x.client).uvarint(x.floor)
		if len(x.ranges) > 0 || x.owner != "" {
			// Absent when empty, so a state without reservations or
			// owners writes what earlier versions wrote.
			e.uvarint(uint64(len(x.ranges)))
			for _, r := range x.ranges {
				e.uvarint(r.next).uvarint(r.end).uvarint(r.epoch)
			}
		}
		if x.owner != "" {
			e.str(x.owner)
		}
		sw.record(recSession, e.b, nil)
		return sw.err != nil
	})
	s.handles.root().Walk(func(_ []byte, h *handle) bool {
		bits := uint64(0)
		if h.excl {
			bits |= 1
		}
		if h.granted {
			bits |= 2
		}
		sw.record(recHandle, e.reset().uvarint(h.id).uvarint(h.session).uvarint(h.ino).uvarint(uint64(h.flags)).uvarint(bits).b, nil)
		return sw.err != nil
	})
	s.locks.root().Walk(func(k []byte, l *xlock) bool {
		e.reset().uvarint(be.Uint64(k)).uvarint(l.holder).uvarint(uint64(len(l.queue)))
		for _, id := range l.queue {
			e.uvarint(id)
		}
		sw.record(recLock, e.b, nil)
		return sw.err != nil
	})
	s.caps.root().Walk(func(_ []byte, c *capab) bool {
		var flags uint64
		if c.excl {
			flags = capExcl
		}
		if c.leecher != 0 {
			flags |= capLeech
		}
		if c.reported {
			flags |= capReport
		}
		e.reset().uvarint(c.ino).uvarint(c.session).uvarint(c.epoch).varint(c.revokeAt).uvarint(flags)
		if c.leecher != 0 {
			ready := uint64(0)
			if c.ready {
				ready = 1
			}
			e.uvarint(c.leecher).uvarint(ready)
		}
		if c.reported {
			e.uvarint(uint64(len(c.changed)))
			prev := uint64(0)
			for _, i := range c.changed {
				e.uvarint(i - prev)
				prev = i
			}
		}
		if c.since != c.epoch {
			// Absent when the tenure began with this grant, so a state
			// without re-grants writes what earlier versions wrote.
			e.uvarint(c.since)
		}
		sw.record(recCap, e.b, nil)
		return sw.err != nil
	})
	s.rlocks.root().Walk(func(k []byte, fl *fileLocks) bool {
		e.reset().uvarint(be.Uint64(k)).uvarint(uint64(len(fl.held)))
		for _, l := range fl.held {
			encodeLock(&e, &l)
		}
		e.uvarint(uint64(len(fl.waiting)))
		for _, l := range fl.waiting {
			encodeLock(&e, &l).uvarint(l.waiter)
		}
		sw.record(recFLocks, e.b, nil)
		return sw.err != nil
	})
	mo := proto.MarshalOptions{Deterministic: true}
	s.sessions.root().Walk(func(_ []byte, x *session) bool {
		for _, d := range x.dups {
			data, err := mo.Marshal(d.r)
			if err != nil {
				sw.err = err
				return true
			}
			sw.record(recDup, e.reset().uvarint(x.id).uvarint(d.seq).bytes(data).b, nil)
		}
		return sw.err != nil
	})
	s.inodes.root().Walk(func(_ []byte, n *inode) bool {
		sw.record(recInode, encodeInode(e.reset(), n).b, nil)
		return sw.err != nil
	})
	s.dirents.root().Walk(func(k []byte, d dent) bool {
		sw.record(recDirent, e.reset().uvarint(be.Uint64(k)).uvarint(d.ino).uvarint(uint64(d.typ)).b, k[8:])
		return sw.err != nil
	})
	written := make(map[block.Hash]struct{})
	s.chunks.root().Walk(func(k []byte, b *block.Block) bool {
		h := b.Hash()
		e.reset().uvarint(be.Uint64(k)).uvarint(be.Uint64(k[8:]))
		e.b = append(e.b, h[:]...)
		if sink != nil {
			sw.extern(sink, written, e.uvarint(uint64(b.Len())).b, b)
			return sw.err != nil
		}
		if _, ok := written[h]; ok {
			sw.record(recRef, e.b, nil)
		} else {
			written[h] = struct{}{}
			// Written while the block is held: its bytes are checksummed
			// and written in more than one step.
			b.View(func(d []byte) { sw.record(recBlock, e.b, d) })
		}
		return sw.err != nil
	})
}

func encodeInode(e *enc, n *inode) *enc {
	parent := n.parent
	if !n.isDir() {
		parent = 0 // derived from the entries (names.go)
	}
	e.uvarint(n.ino).uvarint(n.gen).uvarint(n.size).uvarint(parent).varint(n.atime).varint(n.mtime).varint(n.ctime)
	e.uvarint(uint64(n.mode)).uvarint(uint64(n.nlink)).uvarint(uint64(n.uid)).uvarint(uint64(n.gid))
	e.str(n.target()).uvarint(uint64(len(n.xattrs())))
	for _, a := range n.xattrs() {
		e.str(a.name).bytes(a.value)
	}
	return e
}

func encodeLock(e *enc, l *lockRec) *enc {
	var flags uint64
	if l.write {
		flags |= lockWrite
	}
	if l.bsd {
		flags |= lockBSD
	}
	return e.uvarint(l.session).uvarint(l.owner).uvarint(flags).uvarint(l.start).uvarint(l.end).uvarint(uint64(l.pid))
}

// enc appends the snapshot's field encodings.
type enc struct{ b []byte }

func (e *enc) reset() *enc           { e.b = e.b[:0]; return e }
func (e *enc) uvarint(v uint64) *enc { e.b = binary.AppendUvarint(e.b, v); return e }
func (e *enc) varint(v int64) *enc   { e.b = binary.AppendVarint(e.b, v); return e }
func (e *enc) str(v string) *enc     { e.uvarint(uint64(len(v))); e.b = append(e.b, v...); return e }
func (e *enc) bytes(v []byte) *enc   { e.uvarint(uint64(len(v))); e.b = append(e.b, v...); return e }

// snapWriter buffers, counts and checksums the stream; the first error
// sticks and stops further writes.
type snapWriter struct {
	w       io.Writer
	buf     []byte
	n       int64
	crc     uint32
	records uint64
	err     error
}

// record writes one record whose payload is head followed by tail.
func (sw *snapWriter) record(kind byte, head, tail []byte) {
	var hdr [1 + binary.MaxVarintLen64]byte
	hdr[0] = kind
	l := binary.PutUvarint(hdr[1:], uint64(len(head)+len(tail)))
	sw.raw(hdr[:1+l])
	sw.raw(head)
	sw.raw(tail)
	sw.records++
}

func (sw *snapWriter) raw(p []byte) {
	if len(sw.buf)+len(p) > cap(sw.buf) {
		sw.flush()
	}
	if len(p) > cap(sw.buf)/2 {
		sw.crc = crc32.Update(sw.crc, castagnoli, p)
		sw.write(p)
		return
	}
	sw.buf = append(sw.buf, p...)
}

func (sw *snapWriter) flush() {
	if len(sw.buf) == 0 {
		return
	}
	sw.crc = crc32.Update(sw.crc, castagnoli, sw.buf)
	sw.write(sw.buf)
	sw.buf = sw.buf[:0]
}

func (sw *snapWriter) write(p []byte) {
	if sw.err != nil {
		return
	}
	n, err := sw.w.Write(p)
	sw.n += int64(n)
	sw.err = err
}
