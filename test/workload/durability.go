package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Durability writes large files with distinctive contents while the
// nemesis kills nodes, then checks that every acknowledged write is there
// in full, and that every unacknowledged one is either there in full or
// absent (the file still empty): never torn, never mixed.
type Durability struct {
	Writers int
	Files   int // files each writer writes, one write each
	Size    int // bytes per write (one command: at most client.MaxStreamWrite)
	Prefix  string
	// OpTimeout bounds one write; one that runs out is unacknowledged.
	OpTimeout time.Duration
}

type durFile struct {
	path       string
	ino        uint64
	writer, k  int
	attempted  atomic.Bool
	acked      atomic.Bool
	underFault bool
}

// DurabilityReport counts what happened to the writes.
type DurabilityReport struct {
	Acked, Unacked, UnackedApplied, NotAttempted int
	// AckedUnderFaults were acknowledged before FaultsOver was called.
	AckedUnderFaults int
}

// Pattern is the contents of file k of writer w: 8-byte little-endian
// words that each name the writer, the file and their own position, so a
// torn, shifted or mixed write cannot pass for a whole one.
func Pattern(w, k, size int) []byte {
	b := make([]byte, size+7)
	for i := 0; i < size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(w+1)<<48|uint64(k+1)<<32|uint64(i/8))
	}
	return b[:size]
}

// Execute runs the writers under ctx (the faulty phase), then waits for
// them; verify must be called once the cluster is healed.
func (d Durability) Execute(ctx context.Context, t testing.TB, connect Connect) *DurabilityRun {
	t.Helper()
	setupCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sc, err := connect(setupCtx, "dur-setup")
	if err != nil {
		t.Fatalf("durability setup client: %v", err)
	}
	defer sc.Close()
	cc := sc.WithContext(setupCtx)
	if err := cc.MkdirAll(d.Prefix, 0o755); err != nil {
		t.Fatalf("durability setup: %v", err)
	}
	run := &DurabilityRun{d: d}
	for w := 0; w < d.Writers; w++ {
		for k := 0; k < d.Files; k++ {
			p := fmt.Sprintf("%s/w%d-%d", d.Prefix, w, k)
			if err := cc.WriteFile(p, nil, 0o644); err != nil {
				t.Fatalf("durability setup %s: %v", p, err)
			}
			fi, err := cc.Stat(p)
			if err != nil {
				t.Fatalf("durability setup %s: %v", p, err)
			}
			run.files = append(run.files, &durFile{path: p, ino: fi.Sys().(*pb.Attr).GetIno(), writer: w, k: k})
		}
	}
	var clients []*client.Client
	for w := 0; w < d.Writers; w++ {
		c, err := connect(setupCtx, fmt.Sprintf("dw%d", w))
		if err != nil {
			t.Fatalf("durability writer client: %v", err)
		}
		clients = append(clients, c)
	}
	for w := 0; w < d.Writers; w++ {
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			defer clients[w].Close()
			run.write(ctx, clients[w], w)
		}()
	}
	return run
}

// DurabilityRun is a Durability in progress.
type DurabilityRun struct {
	d          Durability
	files      []*durFile
	wg         sync.WaitGroup
	faultsOver atomic.Bool
}

// FaultsOver tells the writers that the faults have ended: they finish the
// write in progress and start no other.
func (r *DurabilityRun) FaultsOver() { r.faultsOver.Store(true) }

// Names returns the writer client names, for the nemesis.
func (d Durability) Names() []string {
	var out []string
	for w := 0; w < d.Writers; w++ {
		out = append(out, fmt.Sprintf("dw%d", w))
	}
	return out
}

func (r *DurabilityRun) write(ctx context.Context, c *client.Client, w int) {
	for _, f := range r.files {
		if f.writer != w {
			continue
		}
		if ctx.Err() != nil || r.faultsOver.Load() {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, r.d.OpTimeout)
		f.attempted.Store(true)
		n, _, err := c.WriteIno(wctx, f.ino, 0, Pattern(w, f.k, r.d.Size))
		cancel()
		if err == nil && n == r.d.Size {
			f.underFault = !r.faultsOver.Load()
			f.acked.Store(true)
		}
	}
}

// Wait waits for the writers to stop.
func (r *DurabilityRun) Wait() { r.wg.Wait() }

// Verify reads every file through a fresh client and fails t for a lost
// acknowledged write or a torn one.
func (r *DurabilityRun) Verify(t testing.TB, connect Connect) DurabilityReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := connect(ctx, "dur-verify")
	if err != nil {
		t.Fatalf("durability verify client: %v", err)
	}
	defer c.Close()
	var rep DurabilityReport
	buf := make([]byte, r.d.Size+1)
	for _, f := range r.files {
		n, err := c.ReadIno(ctx, f.ino, 0, buf)
		if err != nil {
			t.Errorf("read %s: %v", f.path, err)
			continue
		}
		got := buf[:n]
		whole := bytes.Equal(got, Pattern(f.writer, f.k, r.d.Size))
		switch {
		case f.acked.Load():
			rep.Acked++
			if f.underFault {
				rep.AckedUnderFaults++
			}
			if !whole {
				t.Errorf("acknowledged write LOST or damaged: %s holds %d bytes, want %d exact (%s)", f.path, n, r.d.Size, describeDiff(got, Pattern(f.writer, f.k, r.d.Size)))
			}
		case f.attempted.Load():
			rep.Unacked++
			if whole {
				rep.UnackedApplied++
			} else if n != 0 {
				t.Errorf("unacknowledged write TORN: %s holds %d bytes, want 0 or %d exact (%s)", f.path, n, r.d.Size, describeDiff(got, Pattern(f.writer, f.k, r.d.Size)))
			}
		default:
			rep.NotAttempted++
			if n != 0 {
				t.Errorf("%s was never written but holds %d bytes", f.path, n)
			}
		}
	}
	return rep
}

// Paths lists the files written, for comparing replicas.
func (r *DurabilityRun) Paths() []string {
	var out []string
	for _, f := range r.files {
		out = append(out, f.path)
	}
	return out
}

func describeDiff(got, want []byte) string {
	for i := 0; i < len(got) && i < len(want); i++ {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(got), len(want))
}
