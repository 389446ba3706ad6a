package server_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/blockdir"
	"github.com/memoryfs/memfs/server/servertest"
)

// Snapshot and catch-up figures (docs/benchmarks.md, "Snapshots and catch-up"). Each
// runs once: go test ./server/ -run '^$' -bench 'SnapshotPersist|CatchUp|Rejoin' -benchtime 1x
// Sizes: MEMFS_BENCH_STATE (2 GiB), MEMFS_BENCH_CATCHUP (1 GiB),
// MEMFS_BENCH_REJOIN (256 MiB), in bytes.

func envSize(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkSnapshotPersist: a state of MEMFS_BENCH_STATE unique bytes,
// persisted as a full rewrite (blocks inline, one fsync), then as the
// node does (blocks by hash into an empty block directory), then again
// after 1% of the chunks changed.
func BenchmarkSnapshotPersist(b *testing.B) {
	size := envSize("MEMFS_BENCH_STATE", 2<<30)
	h := ft.New(b, fsm.Config{})
	f := h.F
	h.Must(ft.Mkdir("/d", 0o755))
	fillFSM(h, "/d/big", size, 1)
	tmp := b.TempDir()
	b.ResetTimer()

	full, fullTime := persistFull(b, f, filepath.Join(tmp, "full.snap"))
	dir, err := blockdir.Open(filepath.Join(tmp, "blocks"))
	require.NoError(b, err)
	first, firstTime := persistExternal(b, f, dir, filepath.Join(tmp, "v2-1.snap"))

	chunks := size / chunk
	rng := rand.New(rand.NewPCG(1, 2))
	for range chunks / 100 {
		off := int64(rng.IntN(chunks)) * chunk
		h.Must(ft.Write("/d/big", off, uniqueBytes(chunk, rng.Uint64())))
	}
	second, secondTime := persistExternal(b, f, dir, filepath.Join(tmp, "v2-2.snap"))

	b.ReportMetric(float64(full)/(1<<20), "full-MiB")
	b.ReportMetric(fullTime.Seconds(), "full-s")
	b.ReportMetric(float64(first)/(1<<20), "first-MiB")
	b.ReportMetric(firstTime.Seconds(), "first-s")
	b.ReportMetric(float64(second)/(1<<20), "1pct-MiB")
	b.ReportMetric(secondTime.Seconds(), "1pct-s")
}

// fillFSM writes size unique bytes to path in 1 MiB applies.
func fillFSM(h *ft.Harness, path string, size int, seed uint64) {
	h.OpenSession(60_000)
	r := h.Must(h.Sess(ft.Create(path)))
	h.Must(h.Sess(ft.Close(r.Handle)))
	for off := 0; off < size; off += 1 << 20 {
		h.Must(ft.Write(path, int64(off), uniqueBytes(min(1<<20, size-off), seed<<32+uint64(off))))
	}
}

func persistFull(b *testing.B, f *fsm.FSM, path string) (int64, time.Duration) {
	start := time.Now()
	file, err := os.Create(path)
	require.NoError(b, err)
	w := bufio.NewWriterSize(file, 1<<20)
	n, err := f.Snapshot().WriteTo(w)
	require.NoError(b, err)
	require.NoError(b, w.Flush())
	require.NoError(b, file.Sync())
	require.NoError(b, file.Close())
	return n, time.Since(start)
}

// persistExternal returns the bytes written (snapshot file plus new
// blocks) and the time, syncs included.
func persistExternal(b *testing.B, f *fsm.FSM, dir *blockdir.Dir, path string) (int64, time.Duration) {
	before := dir.Stats().Written
	start := time.Now()
	file, err := os.Create(path)
	require.NoError(b, err)
	w := bufio.NewWriterSize(file, 1<<20)
	n, err := f.Snapshot().WriteExternal(w, dir)
	require.NoError(b, err)
	require.NoError(b, dir.Sync())
	require.NoError(b, w.Flush())
	require.NoError(b, file.Sync())
	require.NoError(b, file.Close())
	return n + int64(dir.Stats().Written-before), time.Since(start)
}

func quietCluster(b *testing.B, store string) *servertest.Cluster {
	return servertest.StartCluster(b, 3, servertest.WithLogStore(store), manualSnapshots(), servertest.WithNodeConfig(func(_ int, c *server.Config) {
		c.Logger = slog.New(slog.DiscardHandler)
	}))
}

// fillCluster writes size unique bytes to path with 8 writers.
func fillCluster(b *testing.B, c *servertest.Cluster, path string, size int, seed uint64) {
	cli := c.Client(c.WaitLeader(10 * time.Second).APIAddr())
	s := openSession(b, cli)
	s.create(path)
	var wg sync.WaitGroup
	for w := range 8 {
		ws := openSession(b, cli)
		wg.Go(func() {
			for off := w << 20; off < size; off += 8 << 20 {
				r := ws.write(path, int64(off), uniqueBytes(min(1<<20, size-off), seed<<32+uint64(off)))
				require.Zero(b, r.GetErrno(), r.GetMessage())
			}
		})
	}
	wg.Wait()
}

// BenchmarkCatchUp: a new node joins a cluster holding MEMFS_BENCH_CATCHUP
// bytes and catches up through a snapshot (metadata through Raft, blocks
// through block sync); against copying as many bytes over one loopback
// TCP stream. The cluster is loaded through the in-memory log store (the
// load is not what is measured); snapshots and blocks are on disk.
func BenchmarkCatchUp(b *testing.B) {
	size := envSize("MEMFS_BENCH_CATCHUP", 1<<30)
	c := quietCluster(b, server.LogStoreMem)
	fillCluster(b, c, "/big", size, 2)
	leader := c.WaitLeader(10 * time.Second)
	snapshotNow(b, leader)
	b.ResetTimer()
	start := time.Now()
	i := c.AddNode()
	joined := time.Since(start)
	n0 := c.Node(i)
	var tRestore, tFetched, tDone time.Duration
	go func() {
		for tDone == 0 {
			time.Sleep(5 * time.Millisecond)
			if tRestore == 0 && n0.SyncRestoring() {
				tRestore = time.Since(start)
			}
			if tFetched == 0 && n0.SyncGotBytes() > 0 && n0.SyncGotBytes() == n0.SyncWantBytes() {
				tFetched = time.Since(start)
			}
		}
	}()
	c.WaitApplied(leader.AppliedIndex(), 10*time.Minute)
	tDone = time.Since(start)
	b.Logf("joined %v restoring %v fetched %v applied %v", joined, tRestore, tFetched, tDone)
	took := time.Since(start)
	n := c.Node(i)
	b.StopTimer()
	tcp := tcpCopy(b, size)
	b.ReportMetric(took.Seconds(), "catchup-s")
	b.ReportMetric(float64(n.SyncFetchedBytesTotal())/(1<<20), "fetched-MiB")
	b.ReportMetric(float64(n.Traffic().NetReceived)/(1<<20), "raft-MiB")
	b.ReportMetric(tcp.Seconds(), "tcp-copy-s")
}

// tcpCopy sends size bytes over one loopback TCP connection.
func tcpCopy(b *testing.B, size int) time.Duration {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer lis.Close()
	done := make(chan int64)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			done <- -1
			return
		}
		n, _ := io.Copy(io.Discard, conn)
		conn.Close()
		done <- n
	}()
	buf := uniqueBytes(1<<20, 99)
	start := time.Now()
	conn, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(b, err)
	for sent := 0; sent < size; sent += len(buf) {
		_, err := conn.Write(buf[:min(len(buf), size-sent)])
		require.NoError(b, err)
	}
	require.NoError(b, conn.Close())
	require.Equal(b, int64(size), <-done)
	return time.Since(start)
}

// BenchmarkRejoin: a follower is stopped, 5% of MEMFS_BENCH_REJOIN bytes
// change (and the leader's log moves past it), and it comes back: what it
// fetches against the whole state. raft-boltdb, as deployed.
func BenchmarkRejoin(b *testing.B) {
	size := envSize("MEMFS_BENCH_REJOIN", 256<<20)
	c := quietCluster(b, server.LogStoreBolt)
	fillCluster(b, c, "/big", size, 3)
	leader := c.WaitLeader(10 * time.Second)
	c.WaitApplied(leader.AppliedIndex(), time.Minute)
	f := follower(c, leader, 0)
	idx := c.Index(f)
	for _, n := range c.Nodes() {
		snapshotNow(b, n)
	}
	c.Stop(idx)
	s := openSession(b, c.Client(leader.APIAddr()))
	chunks := size / chunk
	rng := rand.New(rand.NewPCG(3, 4))
	for range chunks / 20 {
		r := s.write("/big", int64(rng.IntN(chunks))*chunk, uniqueBytes(chunk, rng.Uint64()))
		require.Zero(b, r.GetErrno())
	}
	for i := range 20 {
		s.mkdir(fmt.Sprintf("/after%d", i))
	}
	snapshotNow(b, leader)
	b.ResetTimer()
	start := time.Now()
	n := c.Restart(idx)
	c.WaitApplied(leader.AppliedIndex(), 5*time.Minute)
	took := time.Since(start)
	b.ReportMetric(took.Seconds(), "rejoin-s")
	b.ReportMetric(float64(n.SyncFetchedBytesTotal())/(1<<20), "fetched-MiB")
	b.ReportMetric(float64(n.Traffic().NetReceived)/(1<<20), "raft-MiB")
	b.ReportMetric(float64(size)/(1<<20), "state-MiB")
}
