package server

import (
	"bytes"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// memSnapshots is an ephemeral node's snapshot store. It keeps only the
// latest snapshot. One the node takes itself keeps the state machine's
// snapshot (an immutable version of the tree, taken in O(1)) rather than
// its bytes: a store of bytes would hold a second copy of every block in
// memory, so a node would run out of room at half its data. Bytes are
// made when the snapshot is opened, to send it to a follower; they are
// not kept. A snapshot received from a leader arrives as bytes and is
// kept as bytes until the node's next snapshot replaces it.
type memSnapshots struct {
	mu     sync.Mutex
	latest *memSnap
	seq    int
}

type memSnap struct {
	meta  raft.SnapshotMeta
	data  []byte       // a received snapshot
	state *fsmSnapshot // a snapshot taken here; nil for a received one
}

var _ raft.SnapshotStore = (*memSnapshots)(nil)

func newMemSnapshots() *memSnapshots { return &memSnapshots{} }

// NewMemorySnapshots returns the snapshot store an ephemeral node uses,
// for a caller that gives a node its own Stores and keeps them across the
// node's restarts (a test harness whose "crash" loses only the process).
// Like raft's file store, it lists a snapshot only once its sink has
// closed, and a cancelled one never.
func NewMemorySnapshots() raft.SnapshotStore { return newMemSnapshots() }

func (s *memSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	s.mu.Lock()
	s.seq++
	id := fmt.Sprintf("mem-%d-%d-%d", term, index, s.seq)
	s.mu.Unlock()
	return &memSink{store: s, snap: &memSnap{meta: raft.SnapshotMeta{
		Version: version, ID: id, Index: index, Term: term,
		Configuration: conf, ConfigurationIndex: confIndex,
	}}}, nil
}

func (s *memSnapshots) List() ([]*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.latest == nil {
		return nil, nil
	}
	m := s.latest.meta
	return []*raft.SnapshotMeta{&m}, nil
}

// Open gives the snapshot's bytes. For a snapshot taken here it first
// counts them (Raft sends the size ahead of the stream), then encodes the
// state again into a pipe as the reader reads: the encoding is
// deterministic, so both passes give the same bytes.
func (s *memSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	snap := s.latest
	s.mu.Unlock()
	if snap == nil || snap.meta.ID != id {
		return nil, nil, fmt.Errorf("snapshot %s not found", id)
	}
	m := snap.meta
	if snap.state == nil {
		return &m, io.NopCloser(bytes.NewReader(snap.data)), nil
	}
	var c countWriter
	if err := snap.state.encode(&c); err != nil {
		return nil, nil, fmt.Errorf("encode snapshot %s: %w", id, err)
	}
	m.Size = c.n
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(snap.state.encode(pw)) }()
	return &m, pr, nil
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// memSink collects a received snapshot's bytes, or adopts a state.
type memSink struct {
	store *memSnapshots
	snap  *memSnap
	buf   bytes.Buffer
	done  bool
}

func (k *memSink) ID() string { return k.snap.meta.ID }

func (k *memSink) Write(p []byte) (int, error) { return k.buf.Write(p) }

// keep makes the sink hold st instead of bytes.
func (k *memSink) keep(st *fsmSnapshot) { k.snap.state = st }

func (k *memSink) Close() error {
	if k.done {
		return nil
	}
	k.done = true
	if k.snap.state == nil {
		k.snap.data = k.buf.Bytes()
		k.snap.meta.Size = int64(len(k.snap.data))
	}
	k.store.mu.Lock()
	k.store.latest = k.snap
	k.store.mu.Unlock()
	return nil
}

func (k *memSink) Cancel() error {
	k.done = true
	return nil
}
