package server

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/memoryfs/memfs/internal/heapgoal"
	"github.com/memoryfs/memfs/internal/hugepages"
)

// The raw ceiling of the replication stack: three hashicorp/raft nodes in
// one process over loopback TCP, with the node's stores and settings, and
// a state machine that does nothing. Whatever MemoryFS achieves is measured
// against these numbers (docs/benchmarks.md):
//
//	go test ./server/ -run '^$' -bench RaftCeiling -benchtime 3s

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnapshot{}, nil }
func (nopFSM) Restore(rc io.ReadCloser) error {
	_, err := io.Copy(io.Discard, rc)
	return err
}

// keepFSM keeps a copy of every entry's data, as any in-memory store must:
// the ceiling with the cost of holding what was written (new memory for
// every byte, on every replica) and nothing else.
type keepFSM struct {
	nopFSM
	mu   sync.Mutex
	kept [][]byte
}

func (f *keepFSM) Apply(l *raft.Log) any {
	c := append([]byte(nil), l.Data...)
	f.mu.Lock()
	f.kept = append(f.kept, c)
	f.mu.Unlock()
	return nil
}

type nopSnapshot struct{}

func (nopSnapshot) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnapshot) Release()                          {}

// ceilingCluster starts three raft nodes with the given log store and
// state machines from newFSM, and returns the leader.
func ceilingCluster(b *testing.B, store string, newFSM func() raft.FSM) *raft.Raft {
	b.Helper()
	tuning := DefaultRaftTuning()
	log := raftLogger(slog.New(slog.DiscardHandler), "off")
	var rafts []*raft.Raft
	var servers []raft.Server
	var parts []struct {
		cfg    Config
		stores *openedStores
		trans  *raft.NetworkTransport
	}
	for i := range 3 {
		cfg := Config{ID: fmt.Sprintf("c%d", i), DataDir: filepath.Join(b.TempDir(), "raft"), LogStore: store, Raft: tuning}
		stores, err := openStores(&cfg, log)
		if err != nil {
			b.Fatal(err)
		}
		trans, err := raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, &raft.NetworkTransportConfig{
			Logger: log, MaxPool: tuning.TransportPool, MaxRPCsInFlight: tuning.MaxRPCsInFlight, Timeout: tuning.TransportTimeout})
		if err != nil {
			b.Fatal(err)
		}
		parts = append(parts, struct {
			cfg    Config
			stores *openedStores
			trans  *raft.NetworkTransport
		}{cfg, stores, trans})
		servers = append(servers, raft.Server{ID: raft.ServerID(cfg.ID), Address: trans.LocalAddr()})
	}
	for _, p := range parts {
		rc := tuning.raftConfig(p.cfg.ID)
		rc.Logger = log
		r, err := raft.NewRaft(rc, newFSM(), p.stores.Log, p.stores.Stable, p.stores.Snapshots, p.trans)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			b.Fatal(err)
		}
		rafts = append(rafts, r)
	}
	b.Cleanup(func() {
		for i, r := range rafts {
			_ = r.Shutdown().Error()
			_ = parts[i].trans.Close()
			_ = parts[i].stores.close()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range rafts {
			if r.State() == raft.Leader {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	b.Fatal("no leader")
	return nil
}

// ceilingHeap reserves huge-page backed heap for the ceiling as the node
// does for itself (memfs server --huge-pages), so that both pay the same
// for page faults.
var ceilingHeap sync.Once

func BenchmarkRaftCeiling(b *testing.B) {
	benchCeiling(b, []string{LogStoreBolt, LogStoreWAL, LogStoreMem}, func() raft.FSM { return nopFSM{} })
}

// BenchmarkRaftCeilingKeep is the bolt ceiling with state machines that
// keep every entry's data, under the node's GC headroom (memfs server
// --gc-headroom): what holding the written bytes in memory costs on this
// machine, apart from anything MemoryFS does (docs/benchmarks.md, "GC
// headroom").
func BenchmarkRaftCeilingKeep(b *testing.B) {
	defer heapgoal.Start(256<<20, heapgoal.DefaultMax, slog.New(slog.DiscardHandler)).Stop()
	benchCeiling(b, []string{LogStoreBolt}, func() raft.FSM { return &keepFSM{} })
}

func benchCeiling(b *testing.B, stores []string, newFSM func() raft.FSM) {
	ceilingHeap.Do(func() {
		if sys, err := hugepages.ReadSystem(); err == nil {
			if size, _ := hugepages.Plan(sys, 4<<30); size > 0 {
				_, _ = hugepages.Reserve(size)
			}
		}
	})
	loads := []struct {
		name        string
		size, procs int
	}{
		{"1MiB-x16", 1 << 20, 16},
		{"4KiB-x32", 4 << 10, 32},
	}
	for _, store := range stores {
		for _, load := range loads {
			b.Run(store+"/"+load.name, func(b *testing.B) {
				leader := ceilingCluster(b, store, newFSM)
				data := make([]byte, load.size)
				for i := range data {
					data[i] = byte(i * 31) // not all zeros, in case a layer compresses
				}
				b.SetBytes(int64(load.size))
				b.ResetTimer()
				cpu0 := cpuTime()
				var next atomic.Int64
				var wg sync.WaitGroup
				for range load.procs {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							if err := leader.Apply(data, 0).Error(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
				// CPU per MB: on a machine shared with other work the wall
				// clock varies, the CPU the stack needs far less.
				b.ReportMetric((cpuTime()-cpu0).Seconds()*1e3/(float64(b.N)*float64(load.size)/1e6), "cpu-ms/MB")
			})
		}
	}
}
