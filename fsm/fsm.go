package fsm

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"google.golang.org/protobuf/proto"
)

// FSM is the state machine. Apply, ApplyBytes and Restore must be called
// from one goroutine at a time (Raft's apply loop); every other method may
// be called from any goroutine at any time.
type FSM struct {
	cfg Config
	cur atomic.Pointer[state] // the published state; never modified

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at each publish; guarded by mu
	capsGone chan struct{} // closed and replaced at a publish that dropped capabilities; guarded by mu
}

// New returns an empty file system holding only the root directory.
func New(cfg Config) (*FSM, error) {
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = block.DefaultChunkSize
	}
	s, err := emptyState(cfg.ChunkSize, cfg.MemoryLimit)
	if err != nil {
		return nil, err
	}
	f := &FSM{cfg: cfg, changed: make(chan struct{}), capsGone: make(chan struct{})}
	f.cur.Store(s)
	return f, nil
}

// emptyState is a file system holding only the root directory.
func emptyState(chunkSize int, limit uint64) (*state, error) {
	store, err := block.NewStore(chunkSize, limit)
	if err != nil {
		return nil, err
	}
	s := newState(chunkSize, store)
	s.inodes.put(u64key(rootIno), &inode{ino: rootIno, mode: modeDir | 0o755, nlink: 2, parent: rootIno})
	s.ninodes = 1
	s.commit()
	return s, nil
}

// Apply applies one decoded log entry at index and returns one result per
// command. An entry of another version changes nothing but its index,
// and each of its commands gets EINVAL.
func (f *FSM) Apply(index uint64, e *pb.Entry) []*pb.Result {
	cur := f.cur.Load()
	res := make([]*pb.Result, len(e.GetCommands()))
	if v := e.GetVersion(); v != EntryVersion {
		for i := range res {
			res[i] = errResult(errf(syscall.EINVAL, "entry version %d, want %d", v, EntryVersion))
		}
		f.skip(cur, index)
		return res
	}
	if l := e.GetMemoryLimit(); l != 0 {
		// The leader's budget, so every replica refuses the same writes.
		if l == NoMemoryLimit {
			l = 0
		}
		cur.blocks.SetLimit(l)
	}
	t := begin(cur, index, e.GetTimeNs(), f.cfg.OnChange != nil)
	if e.GetRenewAll() {
		t.renewAllSessions()
	}
	if e.GetRenewFirst() {
		t.renewSessions(e.GetCommands())
	}
	t.expireSessions()
	t.revokeDue()
	for i, c := range e.GetCommands() {
		res[i] = t.safeCommand(c)
	}
	t.commit()
	f.publish(&t.state)
	if t.capsGone {
		f.mu.Lock()
		close(f.capsGone)
		f.capsGone = make(chan struct{})
		f.mu.Unlock()
	}
	if f.cfg.OnChange != nil {
		f.cfg.OnChange(t.ev.event(index))
	}
	return res
}

// ApplyBytes decodes a log entry and applies it. A malformed entry or one
// of an unknown version returns an error wrapping EINVAL and changes
// nothing but the applied index (so that waiters on it proceed).
func (f *FSM) ApplyBytes(index uint64, data []byte) ([]*pb.Result, error) {
	var e pb.Entry
	if err := proto.Unmarshal(data, &e); err != nil {
		f.skip(f.cur.Load(), index)
		return nil, errf(syscall.EINVAL, "fsm: entry %d: %v", index, err)
	}
	if e.Version != EntryVersion {
		f.skip(f.cur.Load(), index)
		return nil, errf(syscall.EINVAL, "fsm: entry %d has version %d, want %d", index, e.Version, EntryVersion)
	}
	return f.Apply(index, &e), nil
}

// skip publishes cur with only its index moved to index.
func (f *FSM) skip(cur *state, index uint64) {
	next := *cur
	next.index = index
	f.publish(&next)
}

func (f *FSM) publish(s *state) {
	f.cur.Store(s)
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// safeCommand runs one command; a panic (a bug, never expected) becomes
// EIO for that command instead of taking the node down. The state stays
// as the command left it, which is the same on every replica.
func (t *tx) safeCommand(c *pb.Command) (r *pb.Result) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("fsm: command panicked", "index", t.index, "panic", p, "stack", string(debug.Stack()))
			r = errResult(errf(syscall.EIO, "internal error: %v", p))
		}
	}()
	return t.command(c)
}

// Query answers a read from the latest applied state. It never blocks and
// never changes anything. Data in the result may share memory with the
// state: callers must not modify it.
func (f *FSM) Query(q *pb.Query) *pb.Result {
	return f.cur.Load().query(q)
}

// AppliedIndex returns the index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return f.cur.Load().index }

// WaitApplied returns once index is applied or ctx is done.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error {
	for {
		ch := f.Changed()
		if f.AppliedIndex() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Changed returns a channel closed at the next apply or restore.
func (f *FSM) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// ChunkSize returns the block size of the current state.
func (f *FSM) ChunkSize() int { return int(f.cur.Load().chunkSize) }

// StoredChunk hashes p (one whole chunk of a write) the way the block
// store does and reports whether a block with that content is stored now.
// The hash comes in the form WriteCmd.hashes takes. The leader uses it to
// send stored chunks by hash (dedup on the wire); the answer may be stale
// when the entry applies, which Apply reports as EREMOTEIO on every
// replica alike.
func (f *FSM) StoredChunk(p []byte) (hash []byte, stored bool) {
	h := block.Sum(p)
	return h[:], f.cur.Load().blocks.Has(h)
}

// Block returns a copy of the bytes of the stored block h, or nil. A copy,
// because block memory goes back to the kernel once the block is
// unreachable, however long the caller keeps the slice.
func (f *FSM) Block(h block.Hash) []byte {
	if b := f.cur.Load().blocks.Get(h); b != nil {
		return b.Bytes()
	}
	return nil
}

// HasBlock reports whether the block h is stored now.
func (f *FSM) HasBlock(h block.Hash) bool { return f.cur.Load().blocks.Has(h) }

// Stats returns totals.
func (f *FSM) Stats() Stats {
	s := f.cur.Load()
	return Stats{
		AppliedIndex: s.index,
		Inodes:       s.ninodes,
		LogicalBytes: s.logical,
		Block:        s.blocks.Stats(),
		Sessions:     uint64(s.sessions.len()),
		Caps:         s.ncaps,
		ChunkSize:    int(s.chunkSize),
	}
}

var _ Applier = (*FSM)(nil)
