package server

import (
	"bufio"
	"bytes"
	"fmt"

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
type blockSnapshots struct {
	raft.SnapshotStore
	sync *blockSync
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
