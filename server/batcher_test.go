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
	pb "github.com/memoryfs/memfs/proto"
)

// heldFuture is an entry in a fake Raft: it commits when the test says so.
type heldFuture struct {
	commands int
	release  chan struct{}
}

func (f *heldFuture) Error() error {
	<-f.release
	return nil
}
func (f *heldFuture) Index() uint64 { return 1 }
func (f *heldFuture) Response() any {
	return &applyResponse{results: make([]*pb.Result, f.commands)}
}

// heldRaft records the entries handed to it; none commits until released.
type heldRaft struct {
	mu      sync.Mutex
	entries []*heldFuture
	sizes   []int
	added   chan struct{} // one token per entry
	seen    int           // tokens taken by waitEntries
}

func (h *heldRaft) apply(data []byte, _ time.Duration) raft.ApplyFuture {
	var e pb.Entry
	if err := proto.Unmarshal(data[1:], &e); err != nil {
		panic(err)
	}
	f := &heldFuture{commands: len(e.Commands), release: make(chan struct{})}
	h.mu.Lock()
	h.entries = append(h.entries, f)
	h.sizes = append(h.sizes, len(data))
	h.mu.Unlock()
	h.added <- struct{}{}
	return f
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
	h := &heldRaft{added: make(chan struct{}, 100)}
	b := &batcher{
		apply: h.apply, clock: time.Now, tuning: tun, metrics: newMetrics("t", func() fsm.Stats { return fsm.Stats{} }, &traffic{}),
		memoryLimit: fsm.NoMemoryLimit,
		in:          make(chan *applyReq, 64),
		slots:       make(chan struct{}, tun.MaxInflightApplies),
		large:       make(chan struct{}, tun.MaxInflightLargeApplies),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
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
