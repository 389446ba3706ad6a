package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// memSnapshots is the snapshot store of the Memory storage: in memory, so
// it survives a crash of the node (the harness keeps it), but, like
// raft's file snapshot store and unlike raft.InmemSnapshotStore, it lists
// a snapshot only once its sink has closed, and a cancelled one never.
// raft.InmemSnapshotStore makes a snapshot the latest as soon as it is
// created, so a node that crashed while writing or installing one came
// back to a snapshot nobody finished.
type memSnapshots struct {
	mu   sync.Mutex
	done []*memSnapshot // closed, oldest first; the last two are kept
}

type memSnapshot struct {
	meta raft.SnapshotMeta
	data []byte
}

func (s *memSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	if version != 1 {
		return nil, fmt.Errorf("unsupported snapshot version %d", version)
	}
	meta := raft.SnapshotMeta{Version: version, ID: fmt.Sprintf("%d-%d", term, index), Index: index, Term: term,
		Configuration: conf, ConfigurationIndex: confIndex}
	return &memSink{store: s, snap: &memSnapshot{meta: meta}}, nil
}

func (s *memSnapshots) List() ([]*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*raft.SnapshotMeta
	for i := len(s.done) - 1; i >= 0; i-- {
		m := s.done[i].meta
		out = append(out, &m)
	}
	return out, nil
}

func (s *memSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sn := range s.done {
		if sn.meta.ID == id {
			m := sn.meta
			return &m, io.NopCloser(bytes.NewReader(sn.data)), nil
		}
	}
	return nil, nil, fmt.Errorf("snapshot %s not found", id)
}

type memSink struct {
	store     *memSnapshots
	snap      *memSnapshot
	buf       bytes.Buffer
	closed    bool // Close may come twice (Persist and Raft both close)
	cancelled bool
}

func (k *memSink) Write(p []byte) (int, error) {
	if k.closed || k.cancelled {
		return 0, errors.New("snapshot sink closed")
	}
	return k.buf.Write(p)
}

func (k *memSink) ID() string    { return k.snap.meta.ID }
func (k *memSink) Cancel() error { k.cancelled = true; return nil }

func (k *memSink) Close() error {
	if k.closed || k.cancelled {
		return nil
	}
	k.closed = true
	k.snap.data = k.buf.Bytes()
	k.snap.meta.Size = int64(len(k.snap.data))
	s := k.store
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = append(s.done, k.snap)
	if len(s.done) > 2 {
		s.done = s.done[len(s.done)-2:]
	}
	return nil
}
