package fsm_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

// benchHarness is a default-config FSM with a session and one open file.
func benchHarness(b testing.TB) (*ft.Harness, uint64) {
	h := ft.New(b, fsm.Config{})
	h.OpenSession(3_600_000)
	return h, h.Must(h.Sess(ft.Create("/f"))).Handle
}

// BenchmarkApplyWrite applies one write per entry through a handle in a
// session (so with the lease renewal and the duplicate record a client
// write costs), new content every time, sequential and wrapping at 256 MiB.
func BenchmarkApplyWrite(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			h, fh := benchHarness(b)
			data := make([]byte, size)
			randFill(data, 9)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			off := int64(0)
			cpu0 := cpuTime()
			for i := 0; b.Loop(); i++ {
				for j := 0; j < size; j += 4096 { // unique content, no dedup
					binary.LittleEndian.PutUint64(data[j:], uint64(i))
				}
				r := h.Do(h.Sess(ft.WriteH(fh, off, data)))
				if r.Errno != 0 {
					b.Fatal(r.Message)
				}
				off = (off + int64(size)) % (256 << 20)
			}
			b.ReportMetric(float64(b.N*size)/1e6/(cpuTime()-cpu0).Seconds(), "MB/cpu-s")
		})
	}
}

// BenchmarkCreate creates empty files: open(O_CREAT|O_EXCL) and close,
// in a session. "entry" puts each command in its own log entry; "batch64"
// puts 64 opens in one entry and their 64 closes in the next, as a loaded
// leader batches them.
func BenchmarkCreate(b *testing.B) {
	for _, batch := range []int{1, 64} {
		b.Run(map[int]string{1: "entry", 64: "batch64"}[batch], func(b *testing.B) {
			h := ft.New(b, fsm.Config{})
			h.OpenSession(3_600_000)
			n := 0
			b.ReportAllocs()
			start, cpu0 := time.Now(), cpuTime()
			for b.Loop() {
				opens := make([]*pb.Command, batch)
				for i := range opens {
					opens[i] = h.Sess(ft.Open(fmt.Sprintf("/d%d/f%d", n/100000, n), ft.OCreat|ft.OExcl|ft.OWronly, 0o644))
					if n%100000 == 0 {
						h.Must(ft.Mkdir(fmt.Sprintf("/d%d", n/100000), 0o755))
					}
					n++
				}
				closes := make([]*pb.Command, batch)
				for i, r := range h.Apply(opens...) {
					if r.Errno != 0 {
						b.Fatal(r.Message)
					}
					closes[i] = h.Sess(ft.Close(r.Handle))
				}
				h.Apply(closes...)
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "creates/s")
			b.ReportMetric(float64(n)/(cpuTime()-cpu0).Seconds(), "creates/cpu-s")
			b.ReportMetric(float64(batch), "files/op")
		})
	}
}

// cpuTime is the CPU time this process has used (GC workers included), a
// measure that other processes on a shared machine disturb less than the
// wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMemoryPerFile measures the heap held per empty file after
// creating 100k of them (in directories of 1000).
func BenchmarkMemoryPerFile(b *testing.B) {
	for b.Loop() {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		h := buildTree(b, 100, 1000)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/100_000, "B/file")
		runtime.KeepAlive(h)
	}
}

// BenchmarkMemoryPerLink measures the heap held per second name of a
// file in another directory (a hard link, what confinement's links index
// holds): 100k empty files in directories of 1000, each then linked into
// a directory of its own tree, 1000 links per entry.
func BenchmarkMemoryPerLink(b *testing.B) {
	for b.Loop() {
		h := buildTree(b, 100, 1000)
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for d := range 100 {
			h.Must(ft.Mkdir(fmt.Sprintf("/l%d", d), 0o755))
			links := make([]*pb.Command, 1000)
			for i := range links {
				links[i] = ft.Link(fmt.Sprintf("/d%d/file-%d", d, i), fmt.Sprintf("/l%d/file-%d", d, i))
			}
			h.Apply(links...)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/100_000, "B/link")
		runtime.KeepAlive(h)
	}
}

// buildTree creates dirs directories of files empty files each, the
// opens of one directory in one entry and their closes in the next.
func buildTree(b testing.TB, dirs, files int) *ft.Harness {
	h := ft.New(b, fsm.Config{})
	h.OpenSession(3_600_000)
	for d := range dirs {
		h.Must(ft.Mkdir(fmt.Sprintf("/d%d", d), 0o755))
		opens := make([]*pb.Command, files)
		for i := range opens {
			opens[i] = h.Sess(ft.Open(fmt.Sprintf("/d%d/file-%d", d, i), ft.OCreat|ft.OWronly, 0o644))
		}
		res := h.Apply(opens...)
		closes := make([]*pb.Command, files)
		for i, r := range res {
			closes[i] = h.Sess(ft.Close(r.Handle))
		}
		h.Apply(closes...)
	}
	return h
}

// TestTenIdenticalFiles checks the dedup target: ten identical 64 MiB
// files cost one file's bytes.
func TestTenIdenticalFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 640 MiB")
	}
	h, _ := benchHarness(t)
	data := make([]byte, 64<<20)
	randFill(data, 10)
	for i := range 10 {
		r := h.Must(h.Sess(ft.Create(fmt.Sprintf("/copy%d", i))))
		h.Must(h.Sess(ft.WriteH(r.Handle, 0, data)))
		h.Must(h.Sess(ft.Close(r.Handle)))
	}
	st := h.F.Stats()
	require.Equal(t, uint64(640<<20), st.LogicalBytes)
	require.LessOrEqual(t, float64(st.Block.PhysicalBytes), 1.05*float64(64<<20))
	t.Logf("10 x 64 MiB: logical %d, physical %d (%.4f x 64 MiB), %d blocks",
		st.LogicalBytes, st.Block.PhysicalBytes, float64(st.Block.PhysicalBytes)/float64(64<<20), st.Block.Blocks)
}

// BenchmarkSnapshot writes the snapshot of 100k empty files.
func BenchmarkSnapshot(b *testing.B) {
	h := buildTree(b, 100, 1000)
	var size int64
	for b.Loop() {
		n, err := h.F.Snapshot().WriteTo(io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		size = n
	}
	b.ReportMetric(float64(size), "snapshot-bytes")
	b.ReportMetric(float64(h.F.Stats().Inodes), "inodes")
}

// BenchmarkRestore reads back the snapshot of 100k empty files.
func BenchmarkRestore(b *testing.B) {
	h := buildTree(b, 100, 1000)
	var buf bytes.Buffer
	if _, err := h.F.Snapshot().WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	f, _ := fsm.New(fsm.Config{})
	for b.Loop() {
		if err := f.Restore(bytes.NewReader(buf.Bytes())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotPause1M builds 1M inodes, then applies 4 KiB writes
// while a snapshot of the tree is written, and reports how long the
// capture took, the apply latencies during the snapshot next to those
// without one (p50, p99, max), and the longest GC stop-the-world pause in
// each window. Apply shares no lock with a snapshot; what the numbers
// show beyond the capture is GC and CPU contention.
func BenchmarkSnapshotPause1M(b *testing.B) {
	h := buildTree(b, 1000, 1000)
	fh := h.Must(h.Sess(ft.Create("/hot"))).Handle
	data := make([]byte, 4096)
	n := 0
	window := func(stop func() bool) (lat []time.Duration, gcMax time.Duration) {
		t0 := time.Now()
		for !stop() {
			binary.LittleEndian.PutUint64(data, uint64(n))
			a := time.Now()
			h.Do(h.Sess(ft.WriteH(fh, int64(n%1024)*4096, data)))
			lat = append(lat, time.Since(a))
			n++
		}
		var gs debug.GCStats
		debug.ReadGCStats(&gs)
		for i, end := range gs.PauseEnd {
			if end.After(t0) {
				gcMax = max(gcMax, gs.Pause[i])
			}
		}
		return lat, gcMax
	}
	report := func(name string, lat []time.Duration, gcMax time.Duration) {
		slices.Sort(lat)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(us(lat[len(lat)/2]), name+"-p50-us")
		b.ReportMetric(us(lat[len(lat)*99/100]), name+"-p99-us")
		b.ReportMetric(us(lat[len(lat)-1]), name+"-max-us")
		b.ReportMetric(us(gcMax), name+"-gc-stw-max-us")
	}
	for b.Loop() {
		var done atomic.Bool
		var snapTime, capture time.Duration
		var size int64
		go func() {
			t0 := time.Now()
			sn := h.F.Snapshot()
			capture = time.Since(t0)
			size, _ = sn.WriteTo(io.Discard)
			snapTime = time.Since(t0)
			done.Store(true)
		}()
		during, gcDuring := window(done.Load)
		deadline := time.Now().Add(snapTime)
		without, gcWithout := window(func() bool { return time.Now().After(deadline) })
		b.ReportMetric(float64(capture.Nanoseconds()), "capture-ns")
		report("during", during, gcDuring)
		report("without", without, gcWithout)
		b.ReportMetric(snapTime.Seconds(), "snapshot-s")
		b.ReportMetric(float64(size), "snapshot-bytes")
	}
}

// BenchmarkMetadataPerFile creates 1M empty files (256 per entry, 10,000
// per directory) and reports the live heap they take per file, then
// writes a snapshot of them while another 100,000 creates apply and
// reports the most the live heap grew meanwhile (sampled every 5 ms, so
// an underestimate of short peaks). Run it with -benchtime 1x: each run
// makes its own million.
func BenchmarkMetadataPerFile(b *testing.B) {
	const files, perDir, perEntry = 1_000_000, 10_000, 256
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	create := func(h *ft.Harness, from, to int) {
		for n := from; n < to; n += perEntry {
			cmds := make([]*pb.Command, 0, perEntry)
			for i := n; i < min(n+perEntry, to); i++ {
				if i%perDir == 0 {
					h.Must(ft.Mkdir(fmt.Sprintf("/d%d", i/perDir), 0o755))
				}
				cmds = append(cmds, ft.Mknod(fmt.Sprintf("/d%d/file-%07d", i/perDir, i), syscall.S_IFREG|0o644, 0))
			}
			for _, r := range h.Apply(cmds...) {
				if r.Errno != 0 {
					b.Fatal(r.Message)
				}
			}
		}
	}
	for b.Loop() {
		h := ft.New(b, fsm.Config{})
		before := live()
		create(h, 0, files)
		after := live()
		b.ReportMetric(float64(after-before)/files, "B/file")

		snap := h.F.Snapshot()
		var peak atomic.Uint64
		done := make(chan struct{})
		go func() {
			var m runtime.MemStats
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
				}
			}
		}()
		wrote := make(chan int64)
		go func() {
			n, err := snap.WriteTo(io.Discard)
			if err != nil {
				b.Error(err)
			}
			wrote <- n
		}()
		create(h, files, files+100_000)
		size := <-wrote
		close(done)
		b.ReportMetric(float64(size)/files, "snapshot-B/file")
		b.ReportMetric(float64(peak.Load()-min(peak.Load(), after))/(1<<20), "heap-growth-MiB")
		runtime.KeepAlive(h)
	}
}
