//go:build chaos

package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// soakTotals is what a soak checked; it is printed and saved at the end.
type soakTotals struct {
	mu           sync.Mutex
	Clusters     int `json:"clusters"`
	Histories    int `json:"histories"`
	Linearizable int `json:"linearizable"`
	Violations   int `json:"violations"`
	Inconclusive int `json:"inconclusive"`
	Operations   int `json:"operations"`
	UnknownOps   int `json:"unknown_operations"`
	// What the caching readers did (workload.CacheStats), summed.
	CachingHistories int `json:"histories_with_caching_readers"`
	CachingOps       int `json:"caching_reader_operations"`
	LocalAnswers     int `json:"caching_reader_local_answers"`
	Recalls          int `json:"caching_reader_inodes_recalled"`
	Freezes          int `json:"caching_reader_freezes"`
	Kills            int `json:"caching_reader_kills"`
	// What the buffering clients did (workload.BufferStats), summed.
	BufferingHistories int            `json:"histories_with_buffering_clients"`
	BufferedAnswers    int            `json:"buffered_changes_answered_locally"`
	Syncs              int            `json:"buffering_syncs"`
	FailedSyncs        int            `json:"buffering_failed_syncs"`
	Confirmed          int            `json:"buffered_answers_confirmed"`
	Voided             int            `json:"buffered_answers_voided"`
	JournalBatches     int            `json:"journal_batches"`
	JournalCommitted   int            `json:"journal_operations_committed"`
	JournalLost        int            `json:"journal_operations_lost"`
	Durability         int            `json:"durability_runs"`
	AckedWrites        int            `json:"acked_writes_checked"`
	UnackedWrites      int            `json:"unacked_writes_checked"`
	FailedSubtests     []string       `json:"failed"`
	ByScenario         map[string]int `json:"histories_by_scenario"`
	Seconds            float64        `json:"seconds"`
	// MaxHeapMiB and MaxGoroutines are the largest live heap (after a GC)
	// and goroutine count seen by the minute-by-minute memory log; a leak
	// shows as growth with the number of clusters run.
	MaxHeapMiB    uint64 `json:"max_heap_mib"`
	MaxGoroutines int    `json:"max_goroutines"`
}

// watchMemory logs the live heap and the goroutine count every interval
// until stop closes, and keeps their maxima in tot.
func watchMemory(t *testing.T, tot *soakTotals, interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		g := runtime.NumGoroutine()
		tot.mu.Lock()
		tot.MaxHeapMiB = max(tot.MaxHeapMiB, ms.HeapAlloc>>20)
		tot.MaxGoroutines = max(tot.MaxGoroutines, g)
		done := tot.Clusters
		tot.mu.Unlock()
		t.Logf("memory: live heap %d MiB, %d goroutines, %d clusters started", ms.HeapAlloc>>20, g, done)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestSoak runs random scenarios on random cluster shapes, many histories
// per cluster, until MEMFS_SOAK_HISTORIES (default 1000) histories have
// been checked. Each cluster runs MEMFS_SOAK_PHASES histories (default 10,
// each MEMFS_SOAK_SECONDS long, default 4) one after another on fresh keys,
// then a durability run. Seeds derive from MEMFS_SEED (default: the clock),
// so a failing cluster's subtest name gives the seed to replay it.
//
// Caching readers join half the clusters whose scenario keeps the clock
// assumption (all but ClockJumps); with MEMFS_SOAK_CACHING=all every
// cluster has them (ClockJumps is then never drawn), for a soak of the
// capabilities. With MEMFS_SOAK_BUFFERED=on some of the caching clients
// of each such cluster (1 or all, drawn per seed) mount with buffered
// metadata. A replay needs the same settings.
func TestSoak(t *testing.T) {
	allCaching := os.Getenv("MEMFS_SOAK_CACHING") == "all"
	buffering := os.Getenv("MEMFS_SOAK_BUFFERED") == "on"
	pool := scenarios
	if allCaching {
		pool = nil
		for _, sc := range scenarios {
			if sc.clockFree() {
				pool = append(pool, sc)
			}
		}
	}
	target := envInt("MEMFS_SOAK_HISTORIES", 1000)
	phases := envInt("MEMFS_SOAK_PHASES", 10)
	d := time.Duration(envInt("MEMFS_SOAK_SECONDS", 4)) * time.Second
	base := time.Now().UnixNano() % 1_000_000_007
	if s := os.Getenv("MEMFS_SEED"); s != "" {
		base, _ = strconv.ParseInt(s, 10, 64)
	}
	tot := &soakTotals{ByScenario: map[string]int{}}
	start := time.Now()
	t.Cleanup(func() { reportSoak(t, tot, start) })
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() { defer close(watched); watchMemory(t, tot, time.Minute, stop) }()
	t.Cleanup(func() { close(stop); <-watched })
	clusters := (target + phases - 1) / phases
	allVariants := []variant{{3, false}, {5, false}, {3, true}, {5, true}}
	for k := 0; k < clusters; k++ {
		seed := base + int64(k)
		r := rand.New(rand.NewSource(seed))
		sc := pool[r.Intn(len(pool))]
		v := allVariants[r.Intn(len(allVariants))]
		if sc.cachers == 0 && sc.clockFree() {
			// Caching readers (1 or 2) join half the other scenarios,
			// with freezes and kills of them among the faults of those
			// that have faults.
			if k := workload.SoakCachers(seed, allCaching); k > 0 {
				sc.cachers = k
				if len(sc.faults) > 0 {
					sc.faults = join(sc.faults, cacherFaults)
				}
				sc.name += fmt.Sprintf("+k%d", sc.cachers)
			}
		}
		if buffering && sc.cachers > 0 {
			sc.buffered = workload.SoakBuffered(seed, sc.cachers)
			if sc.name == "CachingReaders" {
				sc.name += fmt.Sprintf("+k%d", sc.cachers)
			}
			sc.name += fmt.Sprintf("b%d", sc.buffered)
		}
		t.Run(fmt.Sprintf("%s/%v/seed%d", sc.name, v, seed), func(t *testing.T) {
			t.Parallel()
			soakCluster(t, tot, sc, v, seed, phases, d)
		})
	}
}

func soakCluster(t *testing.T, tot *soakTotals, sc scenario, v variant, seed int64, phases int, d time.Duration) {
	t.Logf("seed %d (replay this cluster: MEMFS_SEED=%d MEMFS_SOAK_HISTORIES=%d go test -tags chaos -run TestSoak ./test/chaos/)", seed, seed, phases)
	c := harness.Start(t, options(v, sc.storage, seed))
	tot.mu.Lock()
	tot.Clusters++
	tot.mu.Unlock()
	for p := 0; p < phases; p++ {
		ok := t.Run(fmt.Sprintf("h%d", p), func(t *testing.T) {
			out := runHistory(t, c, sc, v, seed*100+int64(p), d, fmt.Sprintf("/h%d", p))
			tot.mu.Lock()
			defer tot.mu.Unlock()
			tot.Histories++
			tot.ByScenario[sc.name]++
			tot.Operations += out.Verdict.Counts.Ops
			tot.UnknownOps += out.Verdict.Counts.Unknown
			if cs := out.Cache; cs != nil {
				tot.CachingHistories++
				tot.CachingOps += int(cs.Ops.Load())
				tot.LocalAnswers += int(cs.Local.Load())
				tot.Recalls += int(cs.Recalls.Load())
				tot.Freezes += int(cs.Freezes.Load())
				tot.Kills += int(cs.Kills.Load())
				if sc.buffered > 0 {
					tot.BufferingHistories++
					tot.BufferedAnswers += int(cs.Answered.Load())
					tot.Syncs += int(cs.Syncs.Load())
					tot.FailedSyncs += int(cs.FailedSyncs.Load())
					tot.Confirmed += int(cs.Confirmed.Load())
					tot.Voided += int(cs.Voided.Load())
					tot.JournalBatches += int(cs.Batches.Load())
					tot.JournalCommitted += int(cs.Committed.Load())
					tot.JournalLost += int(cs.Lost.Load())
				}
			}
			switch out.Verdict.Result {
			case porcupine.Ok:
				tot.Linearizable++
			case porcupine.Illegal:
				tot.Violations++
			default:
				tot.Inconclusive++
			}
		})
		if !ok {
			tot.mu.Lock()
			tot.FailedSubtests = append(tot.FailedSubtests, t.Name()+fmt.Sprintf("/h%d", p))
			tot.mu.Unlock()
		}
	}
	// Then large patterned writes under crashes on the same cluster.
	t.Run("durability", func(t *testing.T) {
		dc := durabilityCase{faults: []workload.Fault{workload.CrashLeader, workload.CrashAll, workload.PartitionHalves},
			dur: workload.Durability{Writers: 3, Files: 16, Size: 256 << 10}}
		if sc.storage == harness.Ephemeral {
			dc.faults = []workload.Fault{workload.CrashLeader, workload.CrashOne, workload.PartitionHalves}
		}
		rep := durabilityOn(t, c, dc, 2*d, "/dur")
		tot.mu.Lock()
		defer tot.mu.Unlock()
		tot.Durability++
		tot.AckedWrites += rep.Acked
		tot.UnackedWrites += rep.Unacked
	})
}

func reportSoak(t *testing.T, tot *soakTotals, start time.Time) {
	tot.mu.Lock()
	defer tot.mu.Unlock()
	tot.Seconds = time.Since(start).Seconds()
	b, _ := json.MarshalIndent(tot, "", "  ")
	t.Logf("soak summary:\n%s", b)
	dir, err := model.OutDir("soak", 0)
	if err == nil {
		p := filepath.Join(dir, "soak-summary.json")
		if os.WriteFile(p, b, 0o644) == nil {
			t.Logf("summary saved in %s", p)
		}
	}
}
