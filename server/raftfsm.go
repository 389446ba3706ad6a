package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/blockdir"
)

// Log entry types: the first byte of every LogCommand this package writes.
// Append-only numbers, never reused.
const (
	entryFS   byte = 1 // a pb.Entry for the state machine
	entryMeta byte = 2 // a metaOp applied by raftFSM itself
)

// metaOp changes the replicated map node id -> API address. Encoded as
// JSON: rare, tiny, and readable in a log dump.
type metaOp struct {
	Op  string `json:"op"` // "set" or "del"
	ID  string `json:"id"`
	API string `json:"api,omitempty"`
}

const maxMetaBytes = 64 << 10

func encodeMeta(op metaOp) []byte {
	b, _ := json.Marshal(op) // a struct of strings always marshals
	return append([]byte{entryMeta}, b...)
}

// decodeMeta parses the payload of an entryMeta log entry.
func decodeMeta(data []byte) (metaOp, error) {
	var op metaOp
	if len(data) > maxMetaBytes {
		return op, fmt.Errorf("metadata entry of %d bytes", len(data))
	}
	if err := json.Unmarshal(data, &op); err != nil {
		return op, fmt.Errorf("decode metadata entry: %w", err)
	}
	switch {
	case op.ID == "":
		return op, errors.New("metadata entry without node id")
	case op.Op == "set" && op.API == "":
		return op, errors.New("metadata set without api address")
	case op.Op != "set" && op.Op != "del":
		return op, fmt.Errorf("unknown metadata op %q", op.Op)
	}
	return op, nil
}

// applyResponse is what ApplyBatch returns for one log entry; the leader's
// batcher receives it through the ApplyFuture.
type applyResponse struct {
	results []*pb.Result
	err     error
}

// raftFSM adapts fsm.Applier to raft.BatchingFSM. Besides the file system
// it keeps the member API addresses and the index of the last entry it saw,
// which, unlike the fsm's own applied index, also counts metadata and
// configuration entries (linearizable reads wait on it).
type raftFSM struct {
	fsm     fsm.Applier
	log     *slog.Logger
	metrics *metrics

	// Snapshots name blocks by hash and keep them in sync.dir when the
	// node has one (not ephemeral); snaps lists the snapshots whose
	// blocks must stay. ctx bounds restores.
	sync  *blockSync
	snaps *blockSnapshots // nil without a block directory
	ctx   context.Context
	gcMu  sync.Mutex

	mu      sync.Mutex
	members map[string]string // node id -> API address; guarded by mu
	changed chan struct{}     // closed when applied moves; guarded by mu

	applied atomic.Uint64
}

func newRaftFSM(f fsm.Applier, log *slog.Logger, m *metrics) *raftFSM {
	return &raftFSM{fsm: f, log: log, metrics: m, members: map[string]string{}, changed: make(chan struct{})}
}

var _ raft.BatchingFSM = (*raftFSM)(nil)

// Apply applies one entry (raft calls ApplyBatch instead; kept for the
// interface).
func (r *raftFSM) Apply(l *raft.Log) any { return r.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies committed entries in order.
func (r *raftFSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	for i, l := range logs {
		out[i] = r.applyOne(l)
	}
	if len(logs) > 0 {
		r.setApplied(logs[len(logs)-1].Index)
	}
	return out
}

func (r *raftFSM) applyOne(l *raft.Log) *applyResponse {
	if l.Type != raft.LogCommand {
		return &applyResponse{}
	}
	if len(l.Data) == 0 {
		return r.undecodable(l, errors.New("empty entry"))
	}
	switch l.Data[0] {
	case entryFS:
		res, err := r.fsm.ApplyBytes(l.Index, l.Data[1:])
		if err != nil {
			return r.undecodable(l, err)
		}
		return &applyResponse{results: res}
	case entryMeta:
		op, err := decodeMeta(l.Data[1:])
		if err != nil {
			return r.undecodable(l, err)
		}
		r.mu.Lock()
		if op.Op == "set" {
			r.members[op.ID] = op.API
		} else {
			delete(r.members, op.ID)
		}
		r.mu.Unlock()
		return &applyResponse{}
	default:
		return r.undecodable(l, fmt.Errorf("unknown entry type %d", l.Data[0]))
	}
}

// undecodable logs an entry this node cannot apply. Every replica runs the
// same code on the same bytes, so all of them skip it alike; a replica of
// an older version would log the same error loudly.
func (r *raftFSM) undecodable(l *raft.Log, err error) *applyResponse {
	r.log.Error("cannot apply log entry", "index", l.Index, "term", l.Term, "err", err)
	r.metrics.undecodable.Inc()
	return &applyResponse{err: fmt.Errorf("entry %d: %w", l.Index, err)}
}

func (r *raftFSM) setApplied(index uint64) {
	r.applied.Store(index)
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// waitApplied returns once every entry up to index has been applied.
func (r *raftFSM) waitApplied(ctx context.Context, index uint64) error {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if r.applied.Load() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// member returns the API address of node id.
func (r *raftFSM) member(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.members[id]
}

func (r *raftFSM) memberMap() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.members)
}

// Snapshot captures the state in O(1) plus a copy of the small member
// map; Persist does the I/O.
func (r *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	snap := r.fsm.Snapshot()
	if snap == nil {
		return nil, errors.New("state machine returned no snapshot")
	}
	return &fsmSnapshot{
		header: snapshotHeader{Applied: r.applied.Load(), Members: r.memberMap()},
		snap:   snap,
		r:      r,
	}, nil
}

// Restore replaces the state with a snapshot's. Blocks the snapshot names
// by hash come from memory, the block directory or the peers the
// snapshot's member map names (a listed snapshot already has them all on
// disk: blockSnapshots sees to that when its sink closes).
func (r *raftFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<20)
	h, err := readSnapshotHeader(br)
	if err != nil {
		return err
	}
	var src fsm.BlockSource
	if r.sync != nil {
		src = r.sync.source(h.Members)
	}
	ctx := r.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if err := r.fsm.RestoreFrom(ctx, br, src); err != nil {
		return fmt.Errorf("restore state machine: %w", err)
	}
	r.mu.Lock()
	r.members = h.Members
	if r.members == nil {
		r.members = map[string]string{}
	}
	r.mu.Unlock()
	r.setApplied(h.Applied)
	return nil
}

// Snapshot file layout, ahead of the state machine's own stream:
//
//	magic "MFSN" | version byte | meta length uint32 BE | meta JSON
const (
	snapshotMagic   = "MFSN"
	snapshotVersion = 1
	maxSnapshotMeta = 16 << 20
)

// snapshotHeader is the node's part of a snapshot.
type snapshotHeader struct {
	Applied uint64            `json:"applied"`
	Members map[string]string `json:"members"`
}

func writeSnapshotHeader(w io.Writer, h snapshotHeader) error {
	meta, err := json.Marshal(h)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, 9+len(meta))
	buf = append(buf, snapshotMagic...)
	buf = append(buf, snapshotVersion)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(meta)))
	buf = append(buf, meta...)
	_, err = w.Write(buf)
	return err
}

func readSnapshotHeader(r io.Reader) (snapshotHeader, error) {
	var h snapshotHeader
	var fixed [9]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return h, fmt.Errorf("read snapshot header: %w", err)
	}
	if string(fixed[:4]) != snapshotMagic {
		return h, errors.New("not a MemoryFS snapshot (bad magic)")
	}
	if fixed[4] != snapshotVersion {
		return h, fmt.Errorf("snapshot version %d not supported (want %d)", fixed[4], snapshotVersion)
	}
	n := binary.BigEndian.Uint32(fixed[5:])
	if n > maxSnapshotMeta {
		return h, fmt.Errorf("snapshot metadata of %d bytes exceeds %d", n, maxSnapshotMeta)
	}
	meta := make([]byte, n)
	if _, err := io.ReadFull(r, meta); err != nil {
		return h, fmt.Errorf("read snapshot metadata: %w", err)
	}
	if err := json.Unmarshal(meta, &h); err != nil {
		return h, fmt.Errorf("decode snapshot metadata: %w", err)
	}
	return h, nil
}

type fsmSnapshot struct {
	header snapshotHeader
	snap   fsm.Snapshot
	r      *raftFSM
}

// Persist streams the header and the state machine's snapshot to sink.
// With a block directory the stream names blocks by hash and only blocks
// not yet on disk are written (then synced, before the snapshot itself
// is closed); without one the blocks go inline. An ephemeral node's
// store keeps the snapshot itself instead (memsnaps.go).
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if ms, ok := sink.(*memSink); ok {
		ms.keep(s)
		return sink.Close()
	}
	if err := s.encode(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

// encode writes the header and the state machine's stream to w.
func (s *fsmSnapshot) encode(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	err := writeSnapshotHeader(bw, s.header)
	if err == nil {
		err = s.writeState(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	return err
}

// writeState writes the state machine's stream: blocks by hash into the
// block directory (synced) when there is one, inline otherwise. The hold
// keeps collection from taking blocks no listed snapshot names yet; the
// sink's Close checks them again under its own hold.
func (s *fsmSnapshot) writeState(w io.Writer) error {
	dir := s.r.blockDir()
	if dir == nil {
		_, err := s.snap.WriteTo(w)
		return err
	}
	defer dir.Hold()()
	if _, err := s.snap.WriteExternal(w, dir); err != nil {
		return err
	}
	return dir.Sync()
}

// Release runs after Persist: Raft has reaped old snapshots by now, so
// blocks only they named can go.
func (s *fsmSnapshot) Release() {
	if s.r.blockDir() != nil {
		go s.r.collectBlocks()
	}
}

func (r *raftFSM) blockDir() *blockdir.Dir {
	if r.sync == nil {
		return nil
	}
	return r.sync.dir
}

// collectBlocks removes the blocks no kept snapshot names. One runs at a
// time; a snapshot that cannot be read stops it (keeping too much is
// safe, removing too much is not).
func (r *raftFSM) collectBlocks() {
	if !r.gcMu.TryLock() {
		return
	}
	defer r.gcMu.Unlock()
	removed, err := r.blockDir().Retain(r.liveBlocks)
	if err != nil {
		r.log.Warn("block collection skipped", "err", err)
		return
	}
	if removed > 0 {
		r.log.Info("blocks no snapshot needs removed", "blocks", removed)
	}
}

// liveBlocks is the set of blocks the kept snapshots, and those being
// read (sent to a follower), name.
func (r *raftFSM) liveBlocks() (func(block.Hash) bool, error) {
	if r.snaps == nil {
		return nil, errors.New("no snapshot store")
	}
	live, err := r.snaps.liveBlocks()
	if err != nil {
		return nil, err
	}
	return func(h block.Hash) bool { _, ok := live[h]; return ok }, nil
}
