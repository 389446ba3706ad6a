// Package heapgoal bounds how far this process's Go heap may grow past its
// live data before the next collection: a fixed headroom instead of
// GOGC's fixed fraction.
//
// A node keeps every stored file byte in its heap. With GOGC=100 the
// collector lets the heap reach twice the live heap, so a node holding
// 1 GiB of files touches about 2 GiB: the second gigabyte holds only the
// short-lived copies of requests, log entries and encodings, which a much
// smaller space recycles as well. Every page a process touches for the
// first time costs a fault and the kernel's zeroing of it (and on a virtual
// machine that hands freed guest memory back to its host, the host's fault
// too), so that headroom is paid for on every write of new data
// (docs/benchmarks.md, "GC headroom").
//
// After each collection the tuner sets GOGC to headroom/live, clamped, so
// the next goal is about live+headroom. While the live heap is small (a
// metadata-heavy tree) the percentage stays at its maximum (the runtime's
// default for a node, more for a mount, which allocates for every request)
// and the collector runs no more often than it would at that setting.
//
// The package never sets a memory limit and never overrides a GOGC the
// operator set in the environment; it changes nothing but the GC percent.
package heapgoal

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Bounds of the percentage the tuner sets. DefaultMax is the runtime's
// default: with a small live heap the tuner then behaves like no tuner.
// MinPercent caps how often a process with a very large heap collects.
const (
	MinPercent = 10
	DefaultMax = 100
)

// liveMetric is the heap marked live by the last collection.
const liveMetric = "/gc/heap/live:bytes"

// Percent is the GC percent, at most most, that puts the next heap goal
// about headroom above a live heap of the given size.
func Percent(live, headroom uint64, most int) int {
	if live == 0 || headroom >= live*uint64(most)/100 {
		return most
	}
	return int(max(headroom*100/live, MinPercent))
}

// Tuner adjusts GOGC after every collection until Stop.
type Tuner struct {
	headroom   uint64
	most, prev int              // the highest percent; the percent before Start
	sample     []metrics.Sample // only the cleanup goroutine reads into it

	mu      sync.Mutex // orders a cycle's update against Stop
	stopped bool
	set     int // last percent set
}

// sentinel is what the collector frees to signal that a cycle ended. It
// holds a pointer so the tiny allocator never packs it with other objects
// (which would delay its cleanup until they die too).
type sentinel struct{ _ *int }

// Start sets the GC percent to most and begins tuning with the given
// headroom. It returns nil, and changes nothing, when headroom is 0 or
// GOGC is set in the environment.
func Start(headroom uint64, most int, log *slog.Logger) *Tuner {
	if headroom == 0 {
		return nil
	}
	if v := os.Getenv("GOGC"); v != "" {
		log.Info("GC headroom not tuned: GOGC is set", "GOGC", v)
		return nil
	}
	t := &Tuner{headroom: headroom, most: most, set: most, sample: []metrics.Sample{{Name: liveMetric}}}
	t.prev = debug.SetGCPercent(most)
	t.arm()
	log.Info("GC headroom tuned", "headroom", headroom, "max_percent", most)
	return t
}

// arm registers a cleanup that runs once the next collection frees a new
// sentinel; the cleanup re-arms, so the tuner runs once per cycle.
func (t *Tuner) arm() {
	runtime.AddCleanup(new(sentinel), func(t *Tuner) { t.afterGC() }, t)
}

func (t *Tuner) afterGC() {
	metrics.Read(t.sample)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		if p := Percent(t.sample[0].Value.Uint64(), t.headroom, t.most); p != t.set {
			debug.SetGCPercent(p)
			t.set = p
		}
	}
	t.arm()
}

// Percent is the GC percent the tuner set last.
func (t *Tuner) Percent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.set
}

// Stop ends tuning and puts back the percent from before Start.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		debug.SetGCPercent(t.prev)
	}
}
