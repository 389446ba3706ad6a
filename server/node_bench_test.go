package server_test

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// BenchmarkNode measures the node's command path end to end: gRPC to the
// leader, batching, Raft over loopback TCP, the real state machine. Compare
// with BenchmarkRaftCeiling (docs/benchmarks.md):
//
//	go test ./server/ -run '^$' -bench Node -benchtime 3s
func BenchmarkNode(b *testing.B) {
	for _, store := range []string{server.LogStoreBolt, server.LogStoreWAL, server.LogStoreMem} {
		b.Run(store+"/write-1MiB-x16", func(b *testing.B) { benchWrites(b, store, 1<<20, 16) })
		b.Run(store+"/create-4KiB-x32", func(b *testing.B) { benchCreates(b, store, 32) })
		b.Run(store+"/mkdir-x32", func(b *testing.B) { benchMkdirs(b, store, 32) })
	}
}

func benchCluster(b *testing.B, store string) (*servertest.Cluster, pb.MemFSClient) {
	c := servertest.StartCluster(b, 3, servertest.WithLogStore(store), servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}))
	leader := c.WaitLeader(10 * time.Second)
	return c, c.Client(leader.APIAddr())
}

// benchWrites writes size-byte pieces of unique data (no chunk repeats,
// so no dedup) at distinct offsets of one file per worker, each piece one
// unary Apply.
func benchWrites(b *testing.B, store string, size, procs int) {
	_, cli := benchCluster(b, store)
	benchWritesTo(b, cli, size, procs, true)
}

// benchWritesTo is benchWrites on a running cluster; with unique false
// every write carries the same bytes.
func benchWritesTo(b *testing.B, cli pb.MemFSClient, size, procs int, unique bool) {
	sessions := make([]*session, procs)
	for i := range sessions {
		sessions[i] = openSession(b, cli)
		sessions[i].create(fmt.Sprintf("/w%d", i))
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0 := server.CPUTime()
	for w, s := range sessions {
		wg.Go(func() {
			path := fmt.Sprintf("/w%d", w)
			data := pattern(size, 9) // this worker's: written, then reused
			for off := int64(0); ; off += int64(size) {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if unique {
					stamp(data, uint64(i))
				}
				s.write(path, off, data)
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	b.ReportMetric((server.CPUTime()-cpu0).Seconds()*1e3/(float64(b.N)*float64(size)/1e6), "cpu-ms/MB")
}

// stamp writes n and the position at the start of every 4 KiB of data,
// so that no chunk of any supported size repeats another, in this write or
// any other.
func stamp(data []byte, n uint64) {
	for i := 0; i+16 <= len(data); i += 4096 {
		binary.LittleEndian.PutUint64(data[i:], n)
		binary.LittleEndian.PutUint64(data[i+8:], uint64(i))
	}
}

// BenchmarkWireDedup compares 1 MiB writes with dedup on the wire and
// without, of unique data (the cost: one SHA-256 per chunk on the leader)
// and of data already stored (the gain), on the in-memory log store so
// that the CPU, not the disk, sets the pace. -count interleaves the
// variants:
//
//	go test ./server/ -run '^$' -bench WireDedup -benchtime 2s -count 3
func BenchmarkWireDedup(b *testing.B) {
	for _, data := range []string{"unique", "same"} {
		for _, mode := range []string{"on", "off"} {
			b.Run(data+"/"+mode, func(b *testing.B) {
				c := servertest.StartCluster(b, 3, servertest.WithLogStore(server.LogStoreMem), servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
					cfg.Logger = slog.New(slog.DiscardHandler)
					cfg.DisableWireDedup = mode == "off"
				}))
				cli := c.Client(c.WaitLeader(10 * time.Second).APIAddr())
				benchWritesTo(b, cli, 1<<20, 16, data == "unique")
				var logged uint64
				for _, n := range c.Nodes() {
					logged += n.Traffic().LogBytes
				}
				b.ReportMetric(float64(logged)/float64(b.N)/float64(len(c.Nodes())), "log-B/write")
			})
		}
	}
}

// benchCreates creates 4 KiB files the way client.WriteFile does: one
// command (write with create and truncate) per file, one commit round.
func benchCreates(b *testing.B, store string, procs int) {
	_, cli := benchCluster(b, store)
	data := pattern(4096, 3)
	sessions := make([]*session, procs)
	for i := range sessions {
		sessions[i] = openSession(b, cli)
	}
	b.SetBytes(4096)
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w, s := range sessions {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				res := s.apply(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
					Loc: &pb.Loc{Path: fmt.Sprintf("/c%d-%d", w, i)}, Data: data,
					Create: true, Truncate: true, Mode: 0o644}}})
				if res.Errno != 0 {
					b.Error(res.Message)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
}

// benchMkdirs makes directories, one command each: the rate of one-command
// operations with procs clients waiting for their answers.
func benchMkdirs(b *testing.B, store string, procs int) {
	_, cli := benchCluster(b, store)
	sessions := make([]*session, procs)
	for i := range sessions {
		sessions[i] = openSession(b, cli)
	}
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				s.mkdir(fmt.Sprintf("/m%d", i))
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkCloneTree10k times one recursive clone of a tree of 10,000 4 KiB
// files through the leader (one Apply: commit on a majority, applied on
// the leader), on the default fsynced log store:
//
//	go test ./server/ -run '^$' -bench CloneTree10k -benchtime 5x
func BenchmarkCloneTree10k(b *testing.B) {
	_, cli := benchCluster(b, server.LogStoreBolt)
	s := openSession(b, cli)
	s.mkdir("/src")
	sessions := make([]*session, 32)
	for i := range sessions {
		sessions[i] = openSession(b, cli)
	}
	var wg sync.WaitGroup
	for w, ws := range sessions {
		wg.Go(func() {
			for d := w; d < 100; d += len(sessions) {
				dir := fmt.Sprintf("/src/d%d", d)
				ws.mkdir(dir)
				for f := range 100 {
					data := pattern(4096, byte(f))
					stamp(data, uint64(d*100+f))
					res := ws.apply(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
						Loc: &pb.Loc{Path: fmt.Sprintf("%s/f%d", dir, f)}, Data: data, Create: true, Mode: 0o644}}})
					if res.Errno != 0 {
						b.Error(res.Message)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	b.ResetTimer()
	for i := range b.N {
		res := s.apply(&pb.Command{Op: &pb.Command_Clone{Clone: &pb.CloneCmd{
			Src: &pb.Loc{Path: "/src"}, Dst: &pb.Loc{Path: fmt.Sprintf("/dst%d", i)}, Recursive: true}}})
		if res.Errno != 0 {
			b.Fatal(res.Message)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/clone")
}
