// Package fsm is the MemoryFS state machine: the replicated inode tree
// (files, directories, symlinks, hard links, xattrs), client sessions with
// leases and exclusive opens, and the duplicate-request table, over the
// content-addressed block store in fsm/block.
//
// It is deterministic and does no I/O of its own: Apply depends only on the
// state and the entry (time comes from Entry.time_ns, which the leader
// stamps), never on a clock, randomness or map order. Reads (Query) and
// snapshots work on an immutable view of the tree, so they never stop Apply
// for longer than a pointer swap. It must never import Raft or the network.
package fsm

import (
	"context"
	"io"
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// EntryVersion is the Entry.version this code writes and applies.
const EntryVersion = 1

// NoMemoryLimit in Entry.memory_limit lifts the budget; 0 there keeps the
// one in force.
const NoMemoryLimit = math.MaxUint64

// Config fixes a state machine's parameters.
type Config struct {
	// ChunkSize is the block size, fixed when the cluster is created
	// (block.DefaultChunkSize when 0). A snapshot records it.
	ChunkSize int
	// MemoryLimit caps physical block bytes; writes past it fail with
	// ENOSPC. 0 means no limit. An entry that carries a memory_limit
	// replaces it from then on (the leader stamps its own on every entry,
	// so that all replicas enforce the same budget).
	MemoryLimit uint64
	// OnChange, if set, is called from Apply (synchronously, on the apply
	// goroutine) with the inodes and directory entries each entry changed.
	// It must not block and must not call back into the FSM.
	OnChange func(*pb.WatchEvent)
}

// Stats are the state machine's totals at one moment.
type Stats struct {
	AppliedIndex uint64
	Inodes       uint64
	LogicalBytes uint64 // sum of regular file sizes
	Block        block.Stats
	Sessions     uint64
	Caps         uint64 // capabilities held, over all sessions
	ChunkSize    int
}

// Applier is what the server needs from the state machine; *FSM is one.
type Applier interface {
	ApplyBytes(index uint64, data []byte) ([]*pb.Result, error)
	Query(q *pb.Query) *pb.Result
	AppliedIndex() uint64
	WaitApplied(ctx context.Context, index uint64) error
	Changed() <-chan struct{}
	Stats() Stats
	ChunkSize() int
	StoredChunk(p []byte) (hash []byte, stored bool)
	Snapshot() Snapshot
	Restore(r io.Reader) error
	RestoreFrom(ctx context.Context, r io.Reader, src BlockSource) error
	// Block returns a copy of the bytes of a stored block, or nil.
	Block(h block.Hash) []byte
	// HasBlock reports whether a block is stored.
	HasBlock(h block.Hash) bool
	// CapsReleased and NextRevoke tell a leader when a command refused for
	// a recall may pass (caps.go).
	CapsReleased() <-chan struct{}
	NextRevoke() int64
	// BufferedBy tells a node which inodes a linearizable read must wait
	// for (a TouchCmd) before it is answered (touch.go).
	BufferedBy(q *pb.Query, session uint64) []uint64
	// Token looks a bearer token up by its SHA-256 (tokens.go).
	Token(hash []byte) *pb.Token
	// Outside and Confined serve clients confined to a directory
	// (confine.go): a request's inode numbers checked before it is sent
	// on, and the part of a change event such a client may see.
	Outside(root, owner string, m proto.Message) error
	Confined(ev *pb.WatchEvent, root, owner string) *pb.WatchEvent
}

// Snapshot is a captured, immutable state; WriteTo may run concurrently
// with Apply.
type Snapshot interface {
	Index() uint64
	WriteTo(w io.Writer) (int64, error)
	WriteExternal(w io.Writer, sink BlockSink) (int64, error)
}
