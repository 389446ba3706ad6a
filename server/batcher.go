package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
)

// errBatcherClosed is returned to commands still queued when the node stops.
var errBatcherClosed = errors.New("node is shutting down")

// applyReq is one command waiting for its batch.
type applyReq struct {
	cmd   *pb.Command
	size  int
	start time.Time
	done  chan applyOutcome // buffered: the batcher never blocks on it
}

type applyOutcome struct {
	result *pb.Result
	index  uint64
	err    error
}

// batcher coalesces concurrent commands into one pb.Entry per Raft log
// entry. It does not wait to fill a batch: it takes whatever is queued when
// the leader is ready for another entry, so batches grow with load (group
// commit) and a lone command goes out at once. Entries that start with a
// large command have slots of their own (see run).
//
// A small entry waits for two things: an in-flight slot (a bound on
// entries not yet committed) and the apply queue. At most one small entry
// sits in Raft's apply queue, not yet written by the leader's log store;
// the next one forms here meanwhile. Raft writes the leader's log in one
// goroutine, one disk write at a time, and replicates what it has written
// while it writes the next, so commands that arrive during a write join
// the entry of the very next write, whether or not earlier entries have
// committed (docs/operations.md, "Command batching").
type batcher struct {
	apply   func(cmd []byte, timeout time.Duration) raft.ApplyFuture // raft.Apply; tests swap it
	clock   func() time.Time
	tuning  RaftTuning
	metrics *metrics

	in     chan *applyReq
	slots  chan struct{} // one token per entry in flight
	large  chan struct{} // one token per large entry in flight
	queued chan struct{} // one token: a small entry not yet in the leader's log
	watch  *storeWatch   // reports when the leader's log store wrote an entry
	stop   chan struct{}
	done   chan struct{}

	lastTime int64 // last stamp; only the run goroutine touches it

	// term is Raft's current term (nil: always 0, in tests); renewedTerm
	// the last term in which an entry marked renew_all committed. Until
	// one has, this leader marks its entries so: the time without a
	// leader before it counts against no session's lease.
	term        func() uint64
	renewedTerm atomic.Uint64

	// memoryLimit is stamped on every entry: the leader's budget is the
	// one every replica enforces (fsm.NoMemoryLimit when it has none). The
	// memory governor lowers it as the process's other memory grows.
	memoryLimit atomic.Uint64
}

// newBatcher starts a batcher for r. watch must be the one the leader's log
// store reports its writes to.
func newBatcher(r *raft.Raft, clock func() time.Time, t RaftTuning, m *metrics, memoryLimit uint64, watch *storeWatch) *batcher {
	b := newBatcherFunc(r.Apply, clock, t, m, memoryLimit, watch)
	b.term = r.CurrentTerm
	go b.run()
	return b
}

// newBatcherFunc builds a batcher over apply without starting it.
func newBatcherFunc(apply func([]byte, time.Duration) raft.ApplyFuture, clock func() time.Time, t RaftTuning,
	m *metrics, memoryLimit uint64, watch *storeWatch) *batcher {
	if memoryLimit == 0 {
		memoryLimit = fsm.NoMemoryLimit
	}
	b := &batcher{
		apply: apply, clock: clock, tuning: t, metrics: m,
		in:     make(chan *applyReq, 4*t.MaxBatchCommands),
		slots:  make(chan struct{}, t.MaxInflightApplies),
		large:  make(chan struct{}, t.MaxInflightLargeApplies),
		queued: make(chan struct{}, 1),
		watch:  watch,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	b.memoryLimit.Store(memoryLimit)
	return b
}

// submit queues cmd and waits for its result. If ctx ends first the command
// may still be applied: the client retries with the same (session, seq).
func (b *batcher) submit(ctx context.Context, cmd *pb.Command) (*pb.Result, uint64, error) {
	req := &applyReq{cmd: cmd, size: proto.Size(cmd), start: time.Now(), done: make(chan applyOutcome, 1)}
	select {
	case b.in <- req:
	case <-b.stop:
		return nil, 0, errBatcherClosed
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	select {
	case out := <-req.done:
		return out.result, out.index, out.err
	case <-b.done:
		// Stopped; the command may still commit, and a retry finds it.
		select {
		case out := <-req.done:
			return out.result, out.index, out.err
		default:
			return nil, 0, errBatcherClosed
		}
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

// close stops the batcher; queued commands fail with errBatcherClosed and
// entries already in Raft finish on their own.
func (b *batcher) close() {
	close(b.stop)
	<-b.done
}

func (b *batcher) run() {
	defer close(b.done)
	var carry *applyReq
	for {
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-b.in:
			case <-b.stop:
				b.failQueued(nil)
				return
			}
		}
		small := first.size < b.tuning.LargeEntryBytes
		if !b.acquire(small) {
			b.failQueued(first)
			return
		}
		batch, size := []*applyReq{first}, first.size
	drain:
		for len(batch) < b.tuning.MaxBatchCommands {
			select {
			case r := <-b.in:
				if size+r.size > b.tuning.MaxBatchBytes {
					carry = r
					break drain
				}
				batch = append(batch, r)
				size += r.size
			default:
				break drain
			}
		}
		b.send(batch, small)
	}
}

// acquire waits until an entry may go to Raft; false when the batcher
// stops first. A large command (a big write) takes one of the large slots:
// batching cannot share its cost, which is its bytes, and the log stores
// write several large entries per disk write only if several are queued in
// Raft, as in the raw ceiling (docs/operations.md, "Command batching"). A
// small entry also waits until the previous small one has left Raft's
// apply queue, so that commands arriving meanwhile form one entry.
func (b *batcher) acquire(small bool) bool {
	slots := b.large
	if small {
		slots = b.slots
	}
	select {
	case slots <- struct{}{}:
	case <-b.stop:
		return false
	}
	if !small {
		return true
	}
	select {
	case b.queued <- struct{}{}:
		return true
	case <-b.stop:
		<-slots
		return false
	}
}

// releaser returns the function that frees what acquire(small) took: the
// slot when the entry is done, the apply queue at most once, whichever of
// the leader's write and the entry's end comes first.
func (b *batcher) releaser(small bool) (dequeue, release func()) {
	if !small {
		return func() {}, func() { <-b.large }
	}
	var once sync.Once
	dequeue = func() { once.Do(func() { <-b.queued }) }
	return dequeue, func() { dequeue(); <-b.slots }
}

// send encodes batch as one entry and hands it to Raft; a goroutine waits
// for the commit and then frees what acquire took.
func (b *batcher) send(batch []*applyReq, small bool) {
	dequeue, release := b.releaser(small)
	now := b.clock().UnixNano()
	if now <= b.lastTime {
		now = b.lastTime + 1 // log time never runs backwards under one leader
	}
	b.lastTime = now
	// RenewFirst: each command reached this leader before now, so its
	// session is renewed before leases are checked at now; a stalled log
	// store does not end the sessions whose keepalives wait here.
	var term uint64
	if b.term != nil {
		term = b.term()
	}
	renewAll := term != b.renewedTerm.Load()
	entry := &pb.Entry{Version: fsm.EntryVersion, TimeNs: now, MemoryLimit: b.memoryLimit.Load(), RenewFirst: true,
		RenewAll: renewAll, Commands: make([]*pb.Command, len(batch))}
	for i, r := range batch {
		entry.Commands[i] = r.cmd
	}
	data, err := proto.MarshalOptions{}.MarshalAppend([]byte{entryFS}, entry)
	if err != nil {
		b.finish(batch, fmt.Errorf("encode entry: %w", err))
		release()
		return
	}
	b.metrics.batchCommands.Observe(float64(len(batch)))
	b.metrics.batchBytes.Observe(float64(len(data)))
	if small {
		b.watch.add(data, dequeue)
	}
	f := b.apply(data, 0)
	go func() {
		defer release()
		err := futureError(f, b.stop)
		if small {
			b.watch.remove(data) // never written (not leader, shut down): forget it
		}
		if err != nil {
			b.finish(batch, err)
			return
		}
		if renewAll {
			b.renewedTerm.Store(term)
		}
		resp, _ := f.Response().(*applyResponse)
		switch {
		case resp == nil:
			b.finish(batch, errors.New("entry applied without a response"))
		case resp.err != nil:
			b.finish(batch, resp.err)
		case len(resp.results) != len(batch):
			b.finish(batch, fmt.Errorf("state machine returned %d results for %d commands",
				len(resp.results), len(batch)))
		default:
			b.finishResults(batch, resp.results, f.Index())
		}
	}()
}

func (b *batcher) finish(batch []*applyReq, err error) {
	for _, r := range batch {
		r.done <- applyOutcome{err: err}
	}
}

func (b *batcher) finishResults(batch []*applyReq, results []*pb.Result, index uint64) {
	now := time.Now()
	for i, r := range batch {
		res := results[i]
		if res == nil {
			res = &pb.Result{}
		}
		b.metrics.commandDone(commandType(r.cmd), res.GetErrno(), now.Sub(r.start))
		r.done <- applyOutcome{result: res, index: index}
	}
}

// failQueued answers every command still in the queue.
func (b *batcher) failQueued(carry *applyReq) {
	if carry != nil {
		carry.done <- applyOutcome{err: errBatcherClosed}
	}
	for {
		select {
		case r := <-b.in:
			r.done <- applyOutcome{err: errBatcherClosed}
		default:
			return
		}
	}
}

// commandType names a command's operation for metrics and logs.
func commandType(c *pb.Command) string {
	m := c.ProtoReflect()
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("op"))
	if fd == nil {
		return "none"
	}
	return string(fd.Name())
}

// futureError waits for f to finish or stop to close. hashicorp/raft never
// answers an Apply or VerifyLeader future that is still queued (in its
// apply, verify or FSM channel) when it shuts down, so a goroutine blocked
// in f.Error() would wait forever, and with it whatever it references: in
// a process that runs many nodes (the test harness) that was the whole
// raft.Raft with its state machine. Only the goroutine below, holding f,
// stays blocked then. stop must close after raft.Shutdown has returned
// (Node.teardown shuts Raft down before the batcher); a future answered by
// then is still reported as answered.
func futureError(f raft.Future, stop <-chan struct{}) error {
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	select {
	case err := <-errc:
		return err
	case <-stop:
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Millisecond):
		return raft.ErrRaftShutdown
	}
}
