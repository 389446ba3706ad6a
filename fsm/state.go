package fsm

import (
	"cmp"
	"encoding/binary"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// File type bits of Attr.mode (Linux values).
const (
	modeType = 0o170000
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeLnk  = 0o120000
	modeFifo = 0o010000
	modeSock = 0o140000
	modeChr  = 0o020000
	modeBlk  = 0o060000
	modePerm = 0o7777
)

// Limits. Each is enforced before anything changes.
const (
	rootIno       = 1
	maxNameLen    = 255
	maxPathLen    = 4096
	maxSymlinks   = 40
	maxFileSize   = pb.MaxFileSize
	maxWriteLen   = 64 << 20
	maxReadLen    = 64 << 20
	maxXattrName  = 255
	maxXattrValue = 64 << 10
	maxXattrTotal = 1 << 20 // all names and values of one inode
	maxLinks      = 65000
	maxClientLen  = 1024
	readDirLimit  = 1024
	maxReadDir    = 1 << 16
)

var be = binary.BigEndian

// inode is one file, directory or symlink. Values in a tree are immutable:
// a change copies the struct (tx.mut). Kept at 96 bytes: rarely used
// fields live in ext.
type inode struct {
	ino    uint64
	gen    uint64 // log index at creation
	size   uint64 // regular files: logical size; symlinks: target length; devices: rdev
	stored uint64 // bytes held in stored chunks (Attr.blocks)
	// parent is, for a directory, the directory holding it; for another
	// inode, derived from the entries (names.go): the directory of its
	// only name, manyDirs when it has names in several, 0 when none.
	parent uint64
	atime  int64
	mtime  int64
	ctime  int64
	mode   uint32
	nlink  uint32
	uid    uint32
	gid    uint32
	opens  uint32 // handles naming this inode, queued ones included
	ext    *inodeExt
}

// inodeExt holds a symlink's target and the extended attributes. It is
// immutable and shared between inode copies.
type inodeExt struct {
	target string
	xattrs []xattr // sorted by name
}

type xattr struct {
	name  string
	value []byte
}

func (n *inode) isDir() bool { return n.mode&modeType == modeDir }
func (n *inode) isReg() bool { return n.mode&modeType == modeReg }
func (n *inode) isLnk() bool { return n.mode&modeType == modeLnk }

// isSpecial: a FIFO, socket or device, which holds no data in the cluster.
func (n *inode) isSpecial() bool { return specialType(n.mode) }

func (n *inode) isDev() bool {
	t := n.mode & modeType
	return t == modeChr || t == modeBlk
}

func specialType(mode uint32) bool {
	switch mode & modeType {
	case modeFifo, modeSock, modeChr, modeBlk:
		return true
	}
	return false
}

func (n *inode) target() string {
	if n.ext == nil {
		return ""
	}
	return n.ext.target
}

func (n *inode) xattrs() []xattr {
	if n.ext == nil {
		return nil
	}
	return n.ext.xattrs
}

func (n *inode) attr() *pb.Attr {
	a := &pb.Attr{
		Ino: n.ino, Mode: n.mode, Nlink: n.nlink, Uid: n.uid, Gid: n.gid,
		Size: n.size, AtimeNs: n.atime, MtimeNs: n.mtime, CtimeNs: n.ctime,
		Generation: n.gen, Blocks: (n.stored + 511) / 512,
		Xattrs: proto.Uint32(uint32(len(n.xattrs()))),
	}
	if n.isDev() {
		a.Size, a.Rdev = 0, n.size
	}
	return a
}

// dent is a directory entry's value; stored inline in the tree's leaf.
type dent struct {
	ino uint64
	typ uint32 // type bits of the inode's mode
}

// handle is an open file. Queued exclusive opens are handles with granted
// false.
type handle struct {
	id      uint64
	session uint64
	ino     uint64
	flags   uint32 // open flags: access mode, O_APPEND, O_TRUNC
	excl    bool
	granted bool
}

func (h *handle) canRead() bool  { return h.flags&oAccMode != oWronly }
func (h *handle) canWrite() bool { return h.flags&oAccMode != oRdonly }

// xlock is the exclusive-open state of one inode: the holder's handle and
// the handles waiting, first come first served.
type xlock struct {
	holder uint64
	queue  []uint64
}

// session is a client's registration; its lease ends at expires (log
// time). dups holds the results of its commands not yet acknowledged, by
// ascending seq: the duplicate-request table. Like every value in a tree a
// session is immutable once published (tx.sessMut copies it).
type session struct {
	id      uint64
	leaseMs int64
	expires int64
	client  string
	owner   string // Command.owner of the command that opened it
	handles uint32 // its open handles, queued ones included; derived
	dups    []dupRec
	// floor is the highest ack the client has sent: every seq below it
	// has been answered, so a copy of one arriving late (held back by the
	// network, a forward still in flight) is refused, never run again.
	floor uint64
	// ranges are the inode numbers reserved for the session and not yet
	// used (ReserveInodesCmd), oldest first; shared between copies of the
	// session, so changed only on a clone (tx.takeReserved).
	ranges []inoRange
}

// dupRec is one recorded result.
type dupRec struct {
	seq uint64
	r   *pb.Result
}

// maxDups bounds a session's recorded results; a client that never
// acknowledges loses the oldest (a retry that old applies again).
const maxDups = 1 << 16

// recorded returns the result recorded for seq, or nil.
func (s *session) recorded(seq uint64) *pb.Result {
	if i, ok := s.dupIndex(seq); ok {
		return s.dups[i].r
	}
	return nil
}

func (s *session) dupIndex(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(s.dups, seq, func(d dupRec, seq uint64) int { return cmp.Compare(d.seq, seq) })
}

// Open flags (Linux values).
const (
	oRdonly    = 0
	oWronly    = 1
	oRdwr      = 2
	oAccMode   = 3
	oCreat     = 0x40
	oExcl      = 0x80
	oTrunc     = 0x200
	oAppend    = 0x400
	oDirectory = 0x10000
	oNofollow  = 0x20000
)

// state is the whole replicated state. A published state (FSM.cur) is
// never modified; Apply works on a copy whose tabs hold transactions.
type state struct {
	index       uint64 // last applied log index
	now         int64  // log time of the last entry (never goes back)
	nextIno     uint64
	nextHandle  uint64
	nextSession uint64
	ninodes     uint64
	logical     uint64 // sum of regular file sizes
	minLease    int64  // no lease ends before this (0: no sessions); derived
	minRevoke   int64  // no recalled capability is revoked before this (0: none); derived
	ncaps       uint64 // capabilities held; derived
	nexcl       uint64 // of them exclusive; derived
	chunkSize   uint64
	blocks      *block.Store

	inodes   tab[*inode]       // ino -> inode
	dirents  tab[dent]         // parent ino + name -> entry
	chunks   tab[*block.Block] // ino + chunk index -> block
	handles  tab[*handle]      // handle id -> handle
	locks    tab[*xlock]       // ino -> exclusive-open state
	sessions tab[*session]     // session id -> session
	caps     tab[*capab]       // ino + session id -> capability
	rlocks   tab[*fileLocks]   // ino -> POSIX and flock locks (filelocks.go)
	tokens   tab[*token]       // SHA-256 of a bearer token -> token
	// links counts the names of each file (anything but a directory)
	// whose parent field is manyDirs by the directory holding them:
	// ino + parent ino -> names (names.go). Derived from dirents (never in
	// a snapshot); confinement checks read it.
	links tab[uint32]

	// conf is the confinement of the running command or query (confine.go);
	// nil in a published state.
	conf *confinement
}

func newState(chunkSize int, blocks *block.Store) *state {
	return &state{
		nextIno: rootIno + 1, nextHandle: 1, nextSession: 1,
		chunkSize: uint64(chunkSize), blocks: blocks,
		inodes: newTab[*inode](), dirents: newTab[dent](), chunks: newTab[*block.Block](),
		handles: newTab[*handle](), locks: newTab[*xlock](), sessions: newTab[*session](),
		caps: newTab[*capab](), rlocks: newTab[*fileLocks](), tokens: newTab[*token](),
		links: newTab[uint32](),
	}
}

func (s *state) commit() {
	s.inodes.commit()
	s.dirents.commit()
	s.chunks.commit()
	s.handles.commit()
	s.locks.commit()
	s.sessions.commit()
	s.caps.commit()
	s.rlocks.commit()
	s.tokens.commit()
	s.links.commit()
}

// Keys. Big-endian numbers keep tree order equal to numeric order.

func u64key(n uint64) []byte {
	k := make([]byte, 8)
	be.PutUint64(k, n)
	return k
}

func pairKey(a, b uint64) []byte {
	k := make([]byte, 16)
	be.PutUint64(k, a)
	be.PutUint64(k[8:], b)
	return k
}

func dirKey(parent uint64, name string) []byte {
	k := make([]byte, 8+len(name))
	be.PutUint64(k, parent)
	copy(k[8:], name)
	return k
}

func (s *state) inode(ino uint64) *inode {
	var k [8]byte
	be.PutUint64(k[:], ino)
	n, _ := s.inodes.get(k[:])
	return n
}

func (s *state) dirent(parent uint64, name string) (dent, bool) {
	return s.dirents.get(dirKey(parent, name))
}

func (s *state) chunk(ino, idx uint64) *block.Block {
	var k [16]byte
	be.PutUint64(k[:], ino)
	be.PutUint64(k[8:], idx)
	b, _ := s.chunks.get(k[:])
	return b
}

func (s *state) handle(id uint64) *handle {
	var k [8]byte
	be.PutUint64(k[:], id)
	h, _ := s.handles.get(k[:])
	return h
}

func (s *state) lock(ino uint64) *xlock {
	var k [8]byte
	be.PutUint64(k[:], ino)
	l, _ := s.locks.get(k[:])
	return l
}

func (s *state) session(id uint64) *session {
	var k [8]byte
	be.PutUint64(k[:], id)
	x, _ := s.sessions.get(k[:])
	return x
}

// dirEmpty reports whether directory ino has no entries.
func (s *state) dirEmpty(ino uint64) bool {
	it := s.dirents.root().Iterator()
	it.SeekPrefix(u64key(ino))
	_, _, ok := it.Next()
	return !ok
}

// chunkRange calls fn for the stored chunks of ino with index >= from, in
// order, until fn returns false.
func (s *state) chunkRange(ino, from uint64, fn func(idx uint64, b *block.Block) bool) {
	it := s.chunks.root().Iterator()
	it.SeekLowerBound(pairKey(ino, from))
	for {
		k, b, ok := it.Next()
		if !ok || len(k) != 16 || be.Uint64(k) != ino {
			return
		}
		if !fn(be.Uint64(k[8:]), b) {
			return
		}
	}
}
