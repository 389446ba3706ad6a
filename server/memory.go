package server

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/memoryfs/memfs/fsm/block"
)

// ProcessMemory is this process's memory as the kernel counts it, beside
// what its blocks take.
type ProcessMemory struct {
	RSS    uint64 // resident pages
	Anon   uint64 // resident pages not backed by a file (RSS less file and shared pages)
	Blocks uint64 // block memory resident in the arena (fsm/block)
}

var statmPage = uint64(os.Getpagesize())

// ReadProcessMemory reads /proc/self/statm; where there is none (not
// Linux) only Blocks is filled.
func ReadProcessMemory() ProcessMemory {
	m := ProcessMemory{Blocks: block.Arena().Resident}
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return m
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return m
	}
	res, resErr := strconv.ParseUint(string(f[1]), 10, 64)
	shared, sharedErr := strconv.ParseUint(string(f[2]), 10, 64)
	if resErr != nil || sharedErr != nil {
		return m
	}
	m.RSS = res * statmPage
	m.Anon = (res - min(res, shared)) * statmPage
	return m
}

// Memory governor figures. governorMargin covers what may arrive between
// two looks (the batcher's entries in flight and their copies); the
// window keeps the highest other-memory seen, so the budget does not
// rise in a lull between bursts of writes.
const (
	governorPeriod = 200 * time.Millisecond
	governorWindow = 30 * time.Second
	governorMargin = 64 << 20
	// MinProcessMemoryLimit is the least whole-process limit a node takes:
	// below it the node itself (runtime, Raft, buffers) leaves no room for
	// data.
	MinProcessMemoryLimit = 256 << 20
	// minHeapLimit is the least soft limit given to the Go runtime.
	minHeapLimit = 64 << 20
	// After idleAfter without a change in stored bytes, free heap pages
	// past idleHeapWorthReleasing go back to the kernel (releaseWhenIdle).
	idleAfter              = 2 * time.Second
	idleHeapWorthReleasing = 16 << 20
)

// memGovernor keeps the whole process under Config.ProcessMemoryLimit. It
// works out what the process needs besides blocks (need: the live heap
// and room for the collector, the runtime's own memory, the highest in
// the last governorWindow) and gives blocks the rest, less a margin: that is
// the budget the leader stamps on entries, so writes get ENOSPC while the
// process is still under its limit. It also tells the Go runtime how much
// is left for the heap (debug.SetMemoryLimit), so the collector works
// harder as blocks fill the node instead of letting garbage push the
// process over.
//
// Pages of files (the Raft log store's mapping, the page cache of
// snapshots) are not counted: the kernel can drop them under pressure.
type memGovernor struct {
	limit    uint64
	physical func() uint64 // block bytes the state machine holds
	stamp    func(uint64)  // where the block budget goes

	// operatorHeapLimit: GOMEMLIMIT was set in the environment and wins.
	operatorHeapLimit bool

	budget  atomic.Uint64
	samples []sample // other-memory readings within the window

	// For releaseWhenIdle: the physical bytes last seen and since when,
	// the last release, and the free heap the runtime keeps.
	lastPhys              uint64
	changedAt, releasedAt time.Time
	idleHeap              uint64
	sample                []rtmetrics.Sample
}

type sample struct {
	at    time.Time
	other uint64
}

func newMemGovernor(limit uint64, physical func() uint64, stamp func(uint64)) *memGovernor {
	g := &memGovernor{limit: limit, physical: physical, stamp: stamp, operatorHeapLimit: os.Getenv("GOMEMLIMIT") != ""}
	for _, name := range goMetrics {
		g.sample = append(g.sample, rtmetrics.Sample{Name: name})
	}
	g.update(time.Now())
	return g
}

// run updates the budget every governorPeriod until ctx ends, and puts
// back the runtime's memory limit on the way out.
func (g *memGovernor) run(ctx context.Context) {
	if !g.operatorHeapLimit {
		defer debug.SetMemoryLimit(math.MaxInt64)
	}
	t := time.NewTicker(governorPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			g.update(now)
		}
	}
}

// goMetrics are the runtime figures the governor reads.
var goMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
}

// need is the memory the process needs besides blocks: twice the live
// heap (the collector's room to work: the runtime's soft limit keeps the
// heap near that when memory is short), the runtime's own memory (stacks,
// metadata), and anonymous memory the runtime did not map. Free heap
// pages the runtime keeps are not counted: under its soft limit it
// returns them.
func (g *memGovernor) need(m ProcessMemory) uint64 {
	rtmetrics.Read(g.sample)
	v := func(i int) uint64 {
		if g.sample[i].Value.Kind() != rtmetrics.KindUint64 {
			return 0
		}
		return g.sample[i].Value.Uint64()
	}
	live, total, released, free, objects, unused := v(0), v(1), v(2), v(3), v(4), v(5)
	mapped := total - min(total, released)
	g.idleHeap = free + unused
	runtimeOwn := mapped - min(mapped, free+objects+unused)
	foreign := m.Anon - min(m.Anon, m.Blocks+mapped)
	return 2*live + runtimeOwn + foreign
}

func (g *memGovernor) update(now time.Time) {
	m := ReadProcessMemory()
	other := g.need(m)
	g.samples = append(g.samples, sample{now, other})
	i := 0
	for i < len(g.samples)-1 && now.Sub(g.samples[i].at) > governorWindow {
		i++
	}
	g.samples = g.samples[i:]
	for _, s := range g.samples {
		other = max(other, s.other)
	}
	// Dead blocks the collector has not reclaimed yet still hold pages.
	phys := g.physical()
	pending := m.Blocks - min(m.Blocks, phys)
	g.releaseWhenIdle(now, phys)
	budget := uint64(1) // 0 on an entry would mean "keep the last budget"
	if reserve := other + governorMargin + pending; g.limit > reserve+1 {
		budget = g.limit - reserve
	}
	g.budget.Store(budget)
	g.stamp(budget)
	if g.operatorHeapLimit {
		return
	}
	heap := uint64(minHeapLimit)
	if g.limit > m.Blocks+minHeapLimit {
		heap = g.limit - m.Blocks
	}
	debug.SetMemoryLimit(int64(min(heap, 1<<62)))
}

// releaseWhenIdle hands the heap's free pages back to the kernel once the
// stored bytes have not changed for idleAfter: after a burst of writes the
// runtime would otherwise keep the pages its transient copies used (it
// returns them only slowly), and the node's steady memory would be its
// peak. The heap holds no blocks, so the collection this forces is short.
func (g *memGovernor) releaseWhenIdle(now time.Time, phys uint64) {
	if phys != g.lastPhys {
		g.lastPhys, g.changedAt = phys, now
		return
	}
	if now.Sub(g.changedAt) < idleAfter || !g.releasedAt.Before(g.changedAt) || g.idleHeap < idleHeapWorthReleasing {
		return
	}
	debug.FreeOSMemory()
	g.releasedAt = now
}

// Budget is the block budget the governor last set.
func (g *memGovernor) Budget() uint64 { return g.budget.Load() }

// checkProcessLimit refuses a whole-process limit the node cannot live in.
func checkProcessLimit(limit uint64) error {
	if limit != 0 && limit < MinProcessMemoryLimit {
		return fmt.Errorf("process memory limit %d bytes is under the %d a node needs for itself", limit, MinProcessMemoryLimit)
	}
	return nil
}
