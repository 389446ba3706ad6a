package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
)

// heldFuture is an entry in a fake Raft: it commits when the test says so
// (or fails with err).
type heldFuture struct {
	commands int
	data     []byte
	release  chan struct{}
	err      error
}

func (f *heldFuture) Error() error {
	<-f.release
	return f.err
}
func (f *heldFuture) Index() uint64 { return 1 }
func (f *heldFuture) Response() any {
	return &applyResponse{results: make([]*pb.Result, f.commands)}
}

// heldRaft records the entries handed to it; none commits until released.
// Unless holdWrites is set, the leader's log store writes each entry as
// soon as it is handed over.
type heldRaft struct {
	watch      *storeWatch
	holdWrites bool
	mu         sync.Mutex
	entries    []*heldFuture
	sizes      []int
	added      chan struct{} // one token per entry
	seen       int           // tokens taken by waitEntries
}

func (h *heldRaft) apply(data []byte, _ time.Duration) raft.ApplyFuture {
	var e pb.Entry
	if err := proto.Unmarshal(data[1:], &e); err != nil {
		panic(err)
	}
	f := &heldFuture{commands: len(e.Commands), data: data, release: make(chan struct{})}
	h.mu.Lock()
	h.entries = append(h.entries, f)
	h.sizes = append(h.sizes, len(data))
	h.mu.Unlock()
	if !h.holdWrites {
		h.write(f)
	}
	h.added <- struct{}{}
	return f
}

// write is the leader's log store writing f's entry.
func (h *heldRaft) write(f *heldFuture) {
	h.watch.stored([]*raft.Log{{Data: f.data}})
}

func (h *heldRaft) entry(i int) *heldFuture {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.entries[i]
}

func (h *heldRaft) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}

// waitEntries waits until n entries are in flight and checks that no more
// arrive for a moment.
func (h *heldRaft) waitEntries(t *testing.T, n int) {
	t.Helper()
	for h.seen < n {
		select {
		case <-h.added:
			h.seen++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d entries in flight, want %d", h.count(), n)
		}
	}
	select {
	case <-h.added:
		t.Fatalf("more than %d entries in flight", n)
	case <-time.After(100 * time.Millisecond):
	}
}

func bigWriteCmd(n int) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Handle: 1, Data: make([]byte, n)}}}
}

func mkdirCmd(i int) *pb.Command {
	return &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: fmt.Sprintf("/d%d", i)}}}}
}

// Large entries have their own in-flight slots: with the small slots all
// taken, big writes still go to Raft up to their own limit.
// heldBatcher starts a batcher with tuning tun over a heldRaft.
func heldBatcher(tun RaftTuning) (*heldRaft, *batcher) {
	return heldBatcherWrites(tun, false)
}

// heldBatcherWrites is heldBatcher whose log store writes entries only when
// the test calls write, if holdWrites.
func heldBatcherWrites(tun RaftTuning, holdWrites bool) (*heldRaft, *batcher) {
	h := &heldRaft{watch: newStoreWatch(), holdWrites: holdWrites, added: make(chan struct{}, 100)}
	m := newMetrics("t", func() fsm.Stats { return fsm.Stats{} }, func() uint64 { return 0 }, &traffic{})
	b := newBatcherFunc(h.apply, time.Now, tun, m, 0, h.watch)
	go b.run()
	return h, b
}

func TestBatcherLargeEntriesHaveTheirOwnSlots(t *testing.T) {
	tun := DefaultRaftTuning()
	tun.MaxInflightApplies = 2
	tun.MaxInflightLargeApplies = 3
	tun.LargeEntryBytes = 64 << 10
	tun.MaxBatchBytes = 100 << 10 // one large write per entry
	h, b := heldBatcher(tun)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	submit := func(cmd *pb.Command) {
		wg.Go(func() {
			if _, _, err := b.submit(ctx, cmd); err != nil {
				errs <- err
			}
		})
	}

	// Two small entries take both small slots.
	submit(mkdirCmd(0))
	h.waitEntries(t, 1)
	submit(mkdirCmd(1))
	h.waitEntries(t, 2)
	// Large writes are not held back by them: three go out, the fourth
	// waits for a large slot.
	for range 4 {
		submit(bigWriteCmd(80 << 10))
	}
	h.waitEntries(t, 5)
	// A small command queued behind the waiting large write waits too
	// (entries leave the queue in order), and then rides in its entry.
	submit(mkdirCmd(2))
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, 5, h.count())
	close(h.entries[2].release) // the first large write commits
	h.waitEntries(t, 6)
	require.Equal(t, 2, h.entries[5].commands)

	h.mu.Lock()
	for i, size := range h.sizes {
		large := i >= 2
		require.Equal(t, large, size >= tun.LargeEntryBytes, "entry %d of %d bytes", i, size)
	}
	for _, f := range h.entries {
		select {
		case <-f.release:
		default:
			close(f.release)
		}
	}
	h.mu.Unlock()
	wg.Wait()
	b.close()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// A batcher stopped while a large entry waits for a slot answers that
// entry's commands instead of leaving them hanging.
func TestBatcherCloseWhileWaitingForLargeSlot(t *testing.T) {
	tun := DefaultRaftTuning()
	tun.MaxInflightLargeApplies = 1
	tun.LargeEntryBytes = 64 << 10
	tun.MaxBatchBytes = 100 << 10
	h, b := heldBatcher(tun)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { _, _, err := b.submit(ctx, bigWriteCmd(80<<10)); first <- err }()
	h.waitEntries(t, 1)
	second := make(chan error, 1)
	go func() { _, _, err := b.submit(ctx, bigWriteCmd(80<<10)); second <- err }()
	time.Sleep(50 * time.Millisecond)
	b.close()
	select {
	case err := <-second:
		require.True(t, errors.Is(err, errBatcherClosed), "got %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting write was never answered")
	}
	close(h.entries[0].release)
	<-first // answered either way: committed, or "shutting down" (a retry finds it)
	require.Equal(t, 1, h.count())
}

// submitAll submits cmds concurrently and returns a function that waits for
// every answer and checks that each command got its own result.
func submitAll(t *testing.T, b *batcher, cmds []*pb.Command) func() {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		wg.Go(func() {
			res, _, err := b.submit(context.Background(), cmd)
			if err == nil && res == nil {
				err = fmt.Errorf("command %d answered without a result", i)
			}
			errs[i] = err
		})
	}
	return func() {
		t.Helper()
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "command %d", i)
		}
	}
}

// Commands that arrive while the previous entry waits for the leader's
// log write form one entry, which goes to Raft as soon as that write is
// done, while earlier entries have not committed yet; every command is
// answered once they commit.
func TestBatcherNextEntryFormsDuringLeaderWrite(t *testing.T) {
	tun := DefaultRaftTuning()
	tun.MaxInflightApplies = 8
	h, b := heldBatcherWrites(tun, true)
	defer b.close()

	wait1 := submitAll(t, b, []*pb.Command{mkdirCmd(0)})
	h.waitEntries(t, 1)
	// Slots are free, but entry 0 is still queued for the leader's write:
	// these wait and then travel together.
	wait2 := submitAll(t, b, []*pb.Command{mkdirCmd(1), mkdirCmd(2), mkdirCmd(3)})
	// All three submitted: one waits in the batcher's hands, two queued.
	require.Eventually(t, func() bool { return len(b.in) == 2 }, 10*time.Second, time.Millisecond)
	h.waitEntries(t, 1)

	h.write(h.entry(0)) // the leader has written entry 0; it replicates
	h.waitEntries(t, 2)
	require.Equal(t, 3, h.entry(1).commands)

	// A command arriving now forms entry 2 once entry 1 is written, with
	// entries 0 and 1 both still uncommitted.
	wait3 := submitAll(t, b, []*pb.Command{mkdirCmd(4)})
	h.waitEntries(t, 2)
	h.write(h.entry(1))
	h.waitEntries(t, 3)
	h.write(h.entry(2))

	for i := range 3 {
		close(h.entry(i).release)
	}
	wait1()
	wait2()
	wait3()
}

// An entry that Raft refuses without writing it (the node lost the lead)
// frees the apply queue: its commands get the error, later ones go on.
func TestBatcherUnwrittenEntryFreesTheQueue(t *testing.T) {
	h, b := heldBatcherWrites(DefaultRaftTuning(), true)
	defer b.close()
	lost := make(chan error, 1)
	go func() { _, _, err := b.submit(context.Background(), mkdirCmd(0)); lost <- err }()
	h.waitEntries(t, 1)
	wait := submitAll(t, b, []*pb.Command{mkdirCmd(1)})
	h.waitEntries(t, 1)

	f := h.entry(0)
	f.err = raft.ErrNotLeader
	close(f.release)
	require.ErrorIs(t, <-lost, raft.ErrNotLeader)
	h.waitEntries(t, 2)
	h.write(h.entry(1))
	close(h.entry(1).release)
	wait()
}

// The in-flight slots still bound uncommitted entries once they are
// written: with both taken, the next command waits for a commit.
func TestBatcherSlotsBoundWrittenEntries(t *testing.T) {
	tun := DefaultRaftTuning()
	tun.MaxInflightApplies = 2
	h, b := heldBatcher(tun)
	defer b.close()
	wait := submitAll(t, b, []*pb.Command{mkdirCmd(0)})
	h.waitEntries(t, 1)
	wait2 := submitAll(t, b, []*pb.Command{mkdirCmd(1)})
	h.waitEntries(t, 2)
	wait3 := submitAll(t, b, []*pb.Command{mkdirCmd(2)})
	h.waitEntries(t, 2)
	close(h.entry(0).release)
	h.waitEntries(t, 3)
	close(h.entry(1).release)
	close(h.entry(2).release)
	wait()
	wait2()
	wait3()
}
