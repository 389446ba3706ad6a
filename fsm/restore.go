package fsm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"google.golang.org/protobuf/proto"
)

// Restore replaces the state with a snapshot's. The new state is built
// and verified in full (every block re-hashed, every reference checked,
// link and reference counts recomputed) before it is swapped in; on any
// error the old state stays and the error says what was wrong. The
// snapshot's chunk size replaces the configured one. A snapshot that names
// blocks by hash restores only if the current state holds them all; see
// RestoreFrom.
func (f *FSM) Restore(r io.Reader) error {
	return f.RestoreFrom(context.Background(), r, nil)
}

// badSnap reports a malformed snapshot.
func badSnap(format string, args ...any) error {
	return errf(syscall.EINVAL, "snapshot: "+format, args...)
}

// snapReader reads the stream, checksumming every byte it consumes.
type snapReader struct {
	r   *bufio.Reader
	crc uint32
}

func (sr *snapReader) full(p []byte) error {
	if _, err := io.ReadFull(sr.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("snapshot truncated: %w", err)
	}
	sr.crc = crc32.Update(sr.crc, castagnoli, p)
	return nil
}

func (sr *snapReader) uvarint() (uint64, error) {
	var x uint64
	var b [1]byte
	for shift := uint(0); shift < 64; shift += 7 {
		if err := sr.full(b[:]); err != nil {
			return 0, err
		}
		x |= uint64(b[0]&0x7f) << shift
		if b[0] < 0x80 {
			return x, nil
		}
	}
	return 0, badSnap("varint overflows 64 bits")
}

// restorer builds a fresh state from records.
type restorer struct {
	s       *state
	version uint64
	records uint64
	last    byte   // kind of the previous record
	lastKey []byte // its key: keys of one kind must rise strictly

	old     *block.Store       // the state being replaced: blocks to share
	wanted  map[block.Hash]int // index into wants
	wants   []BlockWant
	pending []pendingChunk
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 1<<20) }

// readMagic checks the stream's magic and returns its version.
func readMagic(sr *snapReader) (uint64, error) {
	magic := make([]byte, len(snapMagic))
	if err := sr.full(magic); err != nil {
		return 0, err
	}
	if string(magic) != snapMagic {
		return 0, badSnap("bad magic %q", magic)
	}
	v, err := sr.uvarint()
	if err != nil {
		return 0, err
	}
	if v != snapVersion && v != snapVersionExtern {
		return 0, badSnap("version %d, this build reads %d and %d", v, snapVersion, snapVersionExtern)
	}
	return v, nil
}

// checkSum reads the trailing checksum and compares it with the bytes read.
func (sr *snapReader) checkSum() error {
	want := sr.crc
	var c [4]byte
	if err := sr.full(c[:]); err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint32(c[:]); got != want {
		return badSnap("checksum %08x, computed %08x", got, want)
	}
	return nil
}

func readSnapshot(ctx context.Context, r io.Reader, limit uint64, old *block.Store, src BlockSource) (*state, error) {
	sr := &snapReader{r: bufioReader(r)}
	v, err := readMagic(sr)
	if err != nil {
		return nil, err
	}
	rs := &restorer{version: v, old: old}
	if err := rs.readRecords(sr, limit); err != nil {
		return nil, err
	}
	if err := sr.checkSum(); err != nil {
		return nil, err
	}
	if err := rs.fetchPending(ctx, src); err != nil {
		return nil, err
	}
	rs.s.commit()
	if err := verify(rs.s); err != nil {
		return nil, err
	}
	return rs.s, nil
}

func (rs *restorer) readRecords(sr *snapReader, limit uint64) error {
	var scratch []byte
	for {
		var k [1]byte
		if err := sr.full(k[:]); err != nil {
			return err
		}
		kind := k[0]
		n, err := sr.uvarint()
		if err != nil {
			return err
		}
		max := uint64(maxRecord)
		if kind == recBlock && rs.s != nil {
			max = rs.s.chunkSize + 64
		}
		if n > max {
			return badSnap("record %q of %d bytes", kind, n)
		}
		var p []byte
		if kind == recBlock {
			p = make([]byte, n) // the store adopts the block's bytes
		} else {
			if uint64(cap(scratch)) < n {
				scratch = make([]byte, n)
			}
			p = scratch[:n]
		}
		if err := sr.full(p); err != nil {
			return err
		}
		if kind == recEnd {
			return rs.end(p)
		}
		if err := rs.record(kind, p, limit); err != nil {
			return fmt.Errorf("record %d (%q): %w", rs.records, kind, err)
		}
		rs.records++
	}
}

func (rs *restorer) end(p []byte) error {
	if rs.s == nil {
		return badSnap("no header")
	}
	d := dec{b: p}
	if n := d.uvarint(); d.done() != nil || n != rs.records {
		return badSnap("end record counts %d records, read %d", n, rs.records)
	}
	return nil
}

// order is the record kinds in the order they must come.
const order = "HTSFLCPUIDB"

func isChunk(kind byte) bool { return kind == recBlock || kind == recRef || kind == recExtern }

func rank(kind byte) int {
	if isChunk(kind) {
		kind = recBlock
	}
	for i := range len(order) {
		if order[i] == kind {
			return i
		}
	}
	return -1
}

func (rs *restorer) record(kind byte, p []byte, limit uint64) error {
	r := rank(kind)
	switch {
	case r < 0:
		return badSnap("unknown record kind %q", kind)
	case (rs.s == nil) != (kind == recHeader):
		return badSnap("the header must come first, once")
	case r < rank(rs.last):
		return badSnap("record %q after %q", kind, rs.last)
	}
	if kind != rs.last && !(isChunk(kind) && isChunk(rs.last)) {
		rs.lastKey = rs.lastKey[:0]
	}
	rs.last = kind
	d := &dec{b: p}
	switch kind {
	case recHeader:
		return rs.header(d, limit)
	case recToken:
		return rs.token(d)
	case recSession:
		return rs.session(d)
	case recHandle:
		return rs.handle(d)
	case recLock:
		return rs.lock(d)
	case recCap:
		return rs.capab(d)
	case recFLocks:
		return rs.fileLocks(d)
	case recDup:
		return rs.dup(d)
	case recInode:
		return rs.inode(d)
	case recDirent:
		return rs.dirent(d)
	case recExtern:
		return rs.externChunk(d)
	}
	return rs.chunk(kind, d)
}

func (rs *restorer) header(d *dec, limit uint64) error {
	cs := d.uvarint()
	index, now := d.uvarint(), d.varint()
	nextIno, nextHandle, nextSession, ninodes := d.uvarint(), d.uvarint(), d.uvarint(), d.uvarint()
	if err := d.done(); err != nil {
		return err
	}
	if cs > 16<<20 {
		return badSnap("chunk size %d", cs)
	}
	if nextIno|nextHandle|nextSession >= 1<<62 {
		return badSnap("counters out of range")
	}
	store, err := block.NewStore(int(cs), limit)
	if err != nil {
		return err
	}
	s := newState(int(cs), store)
	s.index, s.now = index, now
	s.nextIno, s.nextHandle, s.nextSession, s.ninodes = nextIno, nextHandle, nextSession, ninodes
	rs.s = s
	return nil
}

func (rs *restorer) token(d *dec) error {
	hash := d.bytes()
	role := d.uvarint()
	k := &token{role: pb.Role(role), name: d.str(), created: d.varint(), expires: d.varint()}
	if d.err == nil && len(d.b) > 0 {
		k.path = d.str()
	}
	if err := d.done(); err != nil {
		return err
	}
	if len(hash) != len(k.hash) || role > uint64(pb.Role_ROLE_ADMIN) || !validTokenRole(k.role) || len(k.name) > maxTokenName {
		return badSnap("token %x: role %d, name of %d bytes", hash, role, len(k.name))
	}
	if k.path != "" && (CheckRoot(k.path) != nil || k.role == pb.Role_ROLE_ADMIN) {
		return badSnap("token %x: confinement %q for role %d", hash, k.path, role)
	}
	copy(k.hash[:], hash)
	return putNew(rs, &rs.s.tokens, k.hash[:], k)
}

func (rs *restorer) session(d *dec) error {
	x := &session{id: d.uvarint(), leaseMs: d.varint(), expires: d.varint(), client: d.str(), floor: d.uvarint()}
	if d.err == nil && len(d.b) > 0 { // written before reservations existed: none
		n := d.uvarint()
		if n > maxRanges {
			return badSnap("session %d: %d reservations", x.id, n)
		}
		for range n {
			x.ranges = append(x.ranges, inoRange{next: d.uvarint(), end: d.uvarint(), epoch: d.uvarint()})
		}
		hasOwner := d.err == nil && len(d.b) > 0
		if hasOwner {
			x.owner = d.str()
		}
		// Each part is written only when it has something, so that the
		// state writes back the same bytes.
		if n == 0 && !hasOwner || hasOwner && x.owner == "" || len(x.owner) > maxClientLen {
			return badSnap("session %d: %d reservations, owner of %d bytes", x.id, n, len(x.owner))
		}
	}
	if err := d.done(); err != nil {
		return err
	}
	return putNew(rs, &rs.s.sessions, u64key(x.id), x)
}

func (rs *restorer) handle(d *dec) error {
	h := &handle{id: d.uvarint(), session: d.uvarint(), ino: d.uvarint()}
	flags, bits := d.uvarint(), d.uvarint()
	if err := d.done(); err != nil {
		return err
	}
	if flags > 0xffffffff || bits > 3 {
		return badSnap("handle %d: flags %#x, bits %#x", h.id, flags, bits)
	}
	h.flags, h.excl, h.granted = uint32(flags), bits&1 != 0, bits&2 != 0
	return putNew(rs, &rs.s.handles, u64key(h.id), h)
}

func (rs *restorer) lock(d *dec) error {
	ino := d.uvarint()
	l := &xlock{holder: d.uvarint()}
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		return badSnap("lock on %d: queue of %d", ino, n)
	}
	for range n {
		l.queue = append(l.queue, d.uvarint())
	}
	if err := d.done(); err != nil {
		return err
	}
	return putNew(rs, &rs.s.locks, u64key(ino), l)
}

func (rs *restorer) capab(d *dec) error {
	c := &capab{ino: d.uvarint(), session: d.uvarint(), epoch: d.uvarint(), revokeAt: d.varint()}
	flags := d.uvarint()
	if flags&capLeech != 0 {
		c.leecher = d.uvarint()
		switch ready := d.uvarint(); ready {
		case 0, 1:
			c.ready = ready == 1
		default:
			return badSnap("capability of session %d on %d: readiness %d", c.session, c.ino, ready)
		}
		if c.leecher == 0 || flags&capExcl == 0 {
			return badSnap("capability of session %d on %d: leecher %d, flags %#x", c.session, c.ino, c.leecher, flags)
		}
	}
	if flags&capReport != 0 {
		n := d.uvarint()
		if n > maxChanged || n > uint64(len(d.b)) || flags&capExcl == 0 {
			return badSnap("capability of session %d on %d: %d changed chunks, flags %#x", c.session, c.ino, n, flags)
		}
		c.reported, c.changed = true, make([]uint64, 0, n)
		prev := uint64(0)
		for k := range n {
			delta := d.uvarint()
			if k > 0 && delta == 0 || prev+delta < prev {
				return badSnap("capability of session %d on %d: changed chunks not ascending", c.session, c.ino)
			}
			prev += delta
			c.changed = append(c.changed, prev)
		}
	}
	c.since = c.epoch // absent: the tenure began with this grant
	if d.err == nil && len(d.b) > 0 {
		c.since = d.uvarint()
		if c.since >= c.epoch {
			// Written only when earlier, so the state writes back the same.
			return badSnap("capability of session %d on %d: tenure from %d, epoch %d", c.session, c.ino, c.since, c.epoch)
		}
	}
	if err := d.done(); err != nil {
		return err
	}
	if flags&^(capExcl|capLeech|capReport) != 0 {
		return badSnap("capability of session %d on %d: flags %#x", c.session, c.ino, flags)
	}
	c.excl = flags&capExcl != 0
	return putNew(rs, &rs.s.caps, pairKey(c.ino, c.session), c)
}

func (rs *restorer) fileLocks(d *dec) error {
	ino := d.uvarint()
	fl := &fileLocks{}
	var err error
	list := func(waiting bool) []lockRec {
		n := d.uvarint()
		if n > maxFileLocks || n > uint64(len(d.b)) {
			err = badSnap("locks on %d: %d of them", ino, n)
			return nil
		}
		out := make([]lockRec, 0, n)
		for range n {
			l := lockRec{session: d.uvarint(), owner: d.uvarint()}
			flags := d.uvarint()
			l.start, l.end = d.uvarint(), d.uvarint()
			pid := d.uvarint()
			if waiting {
				l.waiter = d.uvarint()
			}
			if flags&^(lockWrite|lockBSD) != 0 || pid > math.MaxUint32 {
				err = badSnap("lock on %d: flags %#x, pid %d", ino, flags, pid)
				return nil
			}
			l.write, l.bsd, l.pid = flags&lockWrite != 0, flags&lockBSD != 0, uint32(pid)
			out = append(out, l)
		}
		return out
	}
	fl.held = list(false)
	if err == nil {
		fl.waiting = list(true)
	}
	if err != nil {
		return err
	}
	if err := d.done(); err != nil {
		return err
	}
	return putNew(rs, &rs.s.rlocks, u64key(ino), fl)
}

func (rs *restorer) dup(d *dec) error {
	sess, seq := d.uvarint(), d.uvarint()
	data := d.bytes()
	if err := d.done(); err != nil {
		return err
	}
	r := &pb.Result{}
	if err := proto.Unmarshal(data, r); err != nil {
		return badSnap("result of session %d seq %d: %v", sess, seq, err)
	}
	x := rs.s.session(sess)
	if x == nil || seq == 0 {
		return badSnap("result of session %d seq %d: no such session", sess, seq)
	}
	if err := rs.inOrder(pairKey(sess, seq)); err != nil {
		return err
	}
	if len(x.dups) == maxDups {
		return badSnap("session %d: more than %d results", sess, maxDups)
	}
	x.dups = append(x.dups, dupRec{seq: seq, r: r}) // x is not published yet
	return nil
}

func (rs *restorer) inode(d *dec) error {
	n := &inode{ino: d.uvarint(), gen: d.uvarint(), size: d.uvarint(), parent: d.uvarint(), atime: d.varint(), mtime: d.varint(), ctime: d.varint()}
	mode, nlink, uid, gid := d.uvarint(), d.uvarint(), d.uvarint(), d.uvarint()
	target := d.str()
	nx := d.uvarint()
	if nx > uint64(len(d.b)) {
		return badSnap("inode %d: %d xattrs", n.ino, nx)
	}
	var xs []xattr
	for range nx {
		xs = append(xs, xattr{name: d.str(), value: append([]byte{}, d.bytes()...)})
	}
	if err := d.done(); err != nil {
		return err
	}
	if mode|nlink|uid|gid > 0xffffffff {
		return badSnap("inode %d: field over 32 bits", n.ino)
	}
	n.mode, n.nlink, n.uid, n.gid = uint32(mode), uint32(nlink), uint32(uid), uint32(gid)
	if !n.isDir() {
		n.parent = 0 // verifyDirents derives it from the entries
	}
	if target != "" || len(xs) > 0 {
		n.ext = &inodeExt{target: target, xattrs: xs}
	}
	return putNew(rs, &rs.s.inodes, u64key(n.ino), n)
}

func (rs *restorer) dirent(d *dec) error {
	parent, ino, typ := d.uvarint(), d.uvarint(), d.uvarint()
	if d.err != nil {
		return d.err
	}
	if typ > 0xffffffff {
		return badSnap("entry type %#x", typ)
	}
	return putNew(rs, &rs.s.dirents, dirKey(parent, string(d.b)), dent{ino: ino, typ: uint32(typ)})
}

func (rs *restorer) chunk(kind byte, d *dec) error {
	s := rs.s
	ino, idx := d.uvarint(), d.uvarint()
	hb := d.take(block.HashSize)
	if d.err != nil {
		return d.err
	}
	h, _ := block.ParseHash(hb)
	var b *block.Block
	if kind == recRef {
		if err := d.done(); err != nil {
			return err
		}
		var err error
		if b, err = s.blocks.Ref(h); err != nil {
			return badSnap("chunk %d/%d names block %s not written before", ino, idx, h.Short())
		}
	} else {
		data := d.b
		switch {
		case len(data) == 0 || uint64(len(data)) > s.chunkSize:
			return badSnap("block %s of %d bytes", h.Short(), len(data))
		case block.Sum(data) != h:
			return badSnap("block %s: content does not match its hash", h.Short())
		}
		b = s.blocks.Adopt(h, data)
	}
	return putNew(rs, &s.chunks, pairKey(ino, idx), b)
}

// putNew inserts a record whose key must come after the previous one's:
// the writer walks trees in key order, so anything else is corrupt (and a
// key cannot come twice).
func putNew[T any](rs *restorer, t *tab[T], k []byte, v T) error {
	if err := rs.inOrder(k); err != nil {
		return err
	}
	t.put(k, v)
	return nil
}

func (rs *restorer) inOrder(k []byte) error {
	if len(rs.lastKey) > 0 && bytes.Compare(k, rs.lastKey) <= 0 {
		return badSnap("key %x out of order", k)
	}
	rs.lastKey = append(rs.lastKey[:0], k...)
	return nil
}

// dec reads fields from a record's payload; the first error sticks.
type dec struct {
	b   []byte
	err error
}

func (d *dec) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = badSnap("bad or short uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = badSnap("bad or short varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = badSnap("field of %d bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) bytes() []byte { return d.take(d.uvarint()) }
func (d *dec) str() string   { return string(d.bytes()) }

// done checks that the payload was used up exactly.
func (d *dec) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = badSnap("%d stray bytes in record", len(d.b))
	}
	return d.err
}
