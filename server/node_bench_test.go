package server

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/memoryfs/memfs/proto"
)

// BenchmarkNode measures the node's command path end to end: gRPC to the
// leader, batching, Raft over loopback TCP, the real state machine. Compare
// with BenchmarkRaftCeiling (docs/benchmarks.md):
//
//	go test ./server/ -run '^$' -bench Node -benchtime 3s
func BenchmarkNode(b *testing.B) {
	for _, store := range []string{LogStoreBolt, LogStoreWAL, LogStoreMem} {
		b.Run(store+"/write-1MiB-x16", func(b *testing.B) { benchWrites(b, store, 1<<20, 16) })
		b.Run(store+"/create-4KiB-x32", func(b *testing.B) { benchCreates(b, store, 32) })
		b.Run(store+"/mkdir-x32", func(b *testing.B) { benchMkdirs(b, store, 32) })
	}
}

func benchCluster(b *testing.B, store string) (*Cluster, pb.MemFSClient) {
	c := StartCluster(b, 3, WithLogStore(store), WithNodeConfig(func(_ int, cfg *Config) {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}))
	leader := c.WaitLeader(10 * time.Second)
	return c, c.Client(leader.APIAddr())
}

// benchWrites writes size-byte pieces at distinct offsets of one file per
// worker, each piece one unary Apply.
func benchWrites(b *testing.B, store string, size, procs int) {
	_, cli := benchCluster(b, store)
	data := pattern(size, 9)
	sessions := make([]*session, procs)
	for i := range sessions {
		sessions[i] = openSession(b, cli)
		sessions[i].create(fmt.Sprintf("/w%d", i))
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w, s := range sessions {
		wg.Go(func() {
			path := fmt.Sprintf("/w%d", w)
			for off := int64(0); next.Add(1) <= int64(b.N); off += int64(size) {
				s.write(path, off, data)
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
}

// benchCreates creates 4 KiB files: open(O_CREAT), write, close — three
// commands per file, as a client without compound commands does.
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
				res := s.apply(&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
					Loc: &pb.Loc{Path: fmt.Sprintf("/c%d-%d", w, i)}, Flags: oCreat | oWronly, Mode: 0o644}}})
				if res.Errno != 0 {
					b.Error(res.Message)
					return
				}
				s.apply(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Handle: res.Handle, Data: data}}})
				s.apply(&pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: res.Handle}}})
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
