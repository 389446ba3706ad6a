package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
)

// blockSnapshots wraps a node's snapshot store so that a snapshot becomes
// visible (its sink closes) only once every block it names is durable in
// the node's block directory. A snapshot the node persists itself already
// is; one the leader installs names blocks the node may hold only in
// memory or not at all, and if it were listed first, a node that crashed
// before its restore finished would need its peers to start at all.
//
// It also answers which blocks must stay on disk: those its listed
// snapshots name and those of snapshots being read. Raft reads a snapshot
// to send it to a follower, and may reap it (after newer ones) before the
// follower has fetched its blocks; collecting them then would fail that
// install and waste the transfer.
type blockSnapshots struct {
	raft.SnapshotStore
	sync *blockSync

	// mu orders opens against computing the live set: a snapshot opened
	// is either registered in reading before the set is computed, or was
	// still listed when it was.
	mu      sync.Mutex
	reading map[*readingSnapshot]struct{} // guarded by mu
}

func newBlockSnapshots(store raft.SnapshotStore, sync *blockSync) *blockSnapshots {
	return &blockSnapshots{SnapshotStore: store, sync: sync, reading: map[*readingSnapshot]struct{}{}}
}

// readingSnapshot is an open snapshot, read into memory: with the blocks
// outside it, the stream is the tree's metadata and block names.
type readingSnapshot struct {
	*bytes.Reader
	stream []byte
	s      *blockSnapshots
	once   sync.Once
}

// Close stops keeping the snapshot's blocks for this reader.
func (r *readingSnapshot) Close() error {
	r.once.Do(func() {
		r.s.mu.Lock()
		delete(r.s.reading, r)
		r.s.mu.Unlock()
	})
	return nil
}

// Open implements raft.SnapshotStore. The blocks the snapshot names stay
// on disk until the reader is closed, even if the snapshot is reaped.
func (s *blockSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, stream, err := s.readAll(id)
	if err != nil {
		return nil, nil, err
	}
	r := &readingSnapshot{Reader: bytes.NewReader(stream), stream: stream, s: s}
	s.reading[r] = struct{}{}
	return meta, r, nil
}

func (s *blockSnapshots) readAll(id string) (*raft.SnapshotMeta, []byte, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	stream, err := io.ReadAll(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return meta, stream, nil
}

// liveBlocks returns every block a listed snapshot or a snapshot being
// read names. A snapshot that cannot be read is an error: keeping too
// much is safe, removing too much is not.
func (s *blockSnapshots) liveBlocks() (map[block.Hash]struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	metas, err := s.List()
	if err != nil {
		return nil, err
	}
	live := map[block.Hash]struct{}{}
	for _, m := range metas {
		_, stream, err := s.readAll(m.ID)
		if err == nil {
			err = scanStream(stream, live)
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", m.ID, err)
		}
	}
	for r := range s.reading {
		if err := scanStream(r.stream, live); err != nil {
			return nil, fmt.Errorf("snapshot being read: %w", err)
		}
	}
	return live, nil
}

// scanStream adds the blocks a snapshot stream names to live.
func scanStream(stream []byte, live map[block.Hash]struct{}) error {
	br := bufio.NewReader(bytes.NewReader(stream))
	if _, err := readSnapshotHeader(br); err != nil {
		return err
	}
	return fsm.ScanBlocks(br, func(h block.Hash, _ uint64) { live[h] = struct{}{} })
}

func (s *blockSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.SnapshotStore.Create(version, index, term, conf, confIndex, trans)
	if err != nil {
		return nil, err
	}
	return &blockSink{SnapshotSink: sink, sync: s.sync}, nil
}

// blockSink keeps a copy of the stream (a version 2 snapshot is metadata
// only) to find the blocks it names.
type blockSink struct {
	raft.SnapshotSink
	sync *blockSync
	buf  bytes.Buffer
}

func (k *blockSink) Write(p []byte) (int, error) {
	k.buf.Write(p)
	return k.SnapshotSink.Write(p)
}

func (k *blockSink) Close() error {
	if err := k.sync.ensureOnDisk(k.buf.Bytes()); err != nil {
		_ = k.SnapshotSink.Cancel()
		return fmt.Errorf("snapshot %s: blocks: %w", k.ID(), err)
	}
	return k.SnapshotSink.Close()
}

// ensureOnDisk makes every block a snapshot stream names durable in the
// block directory: from memory when the state machine holds it, else
// fetched from the peers the snapshot's member map names.
func (b *blockSync) ensureOnDisk(stream []byte) error {
	br := bufio.NewReader(bytes.NewReader(stream))
	h, err := readSnapshotHeader(br)
	if err != nil {
		return err
	}
	defer b.dir.Hold()()
	var want []fsm.BlockWant
	seen := map[block.Hash]bool{}
	err = fsm.ScanBlocks(br, func(hash block.Hash, size uint64) {
		if seen[hash] || b.dir.Has(hash) {
			return
		}
		seen[hash] = true
		if d := b.fsm.Block(hash); d != nil {
			err = b.dir.PutBlock(hash, d)
			return
		}
		want = append(want, fsm.BlockWant{Hash: hash, Size: size})
	})
	if err != nil {
		return err
	}
	if len(want) > 0 {
		if _, err := b.source(h.Members).Blocks(b.ctx, want); err != nil {
			return err
		}
	}
	return b.dir.Sync()
}
