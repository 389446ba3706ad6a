package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/workload"
)

// durabilityCase is a durability run: large patterned writes under crashes.
type durabilityCase struct {
	name    string
	storage harness.Storage
	faults  []workload.Fault
	dur     workload.Durability
}

var durabilityCases = []durabilityCase{
	// The leader is killed again and again while multi-MiB files are
	// written (6.824 has no such test; the MemoryFS seed's benchmarks wrote
	// 10 MB files).
	{name: "LeaderKilledDuringLargeWrites", storage: harness.Disk,
		faults: []workload.Fault{workload.CrashLeader},
		dur:    workload.Durability{Writers: 2, Files: 12, Size: 3 << 20}},
	// Every node killed at once, minorities killed, partitions: nothing
	// acknowledged may be lost, nothing unacknowledged may be torn.
	{name: "DurabilityCrashAll", storage: harness.Disk,
		faults: []workload.Fault{workload.CrashAll, workload.CrashMinority, workload.PartitionHalves, workload.IsolateLeader},
		dur:    workload.Durability{Writers: 4, Files: 24, Size: 256 << 10}},
	{name: "DurabilityCrashAllInMemoryStores", storage: harness.Memory,
		faults: []workload.Fault{workload.CrashAll, workload.CrashLeader, workload.Bridge},
		dur:    workload.Durability{Writers: 4, Files: 24, Size: 256 << 10}},
}

func TestDurability(t *testing.T) {
	for _, dc := range durabilityCases {
		for _, v := range variants() {
			t.Run(dc.name+"/"+v.String(), func(t *testing.T) {
				t.Parallel()
				runDurability(t, dc, v, 2*duration())
			})
		}
	}
}

func runDurability(t *testing.T, dc durabilityCase, v variant, d time.Duration) workload.DurabilityReport {
	seed := workload.Seed(t)
	c := harness.Start(t, options(v, dc.storage, seed))
	return durabilityOn(t, c, dc, d, "/dur")
}

// durabilityOn runs dc on cluster c, its files under prefix.
func durabilityOn(t *testing.T, c *harness.Cluster, dc durabilityCase, d time.Duration, prefix string) workload.DurabilityReport {
	connect := connectTo(c)
	dur := dc.dur
	dur.Prefix = prefix

	// A write that runs out of time during the faults is an unacknowledged
	// one to check; the one in progress when they end may finish.
	dur.OpTimeout = 3 * time.Second
	wctx, wcancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer wcancel()
	run := dur.Execute(wctx, t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	nem := &workload.Nemesis{T: c, Faults: dc.faults, Clients: dur.Names(), Logf: t.Logf,
		HoldMin: 200 * time.Millisecond, HoldMax: time.Second,
		CalmMin: 500 * time.Millisecond, CalmMax: 1500 * time.Millisecond}
	err := nem.Run(ctx)
	run.FaultsOver()
	if err != nil {
		t.Fatalf("nemesis: %v", err)
	}
	run.Wait()
	rep := run.Verify(t, connect)
	t.Logf("durability: %+v after %d fault episodes", rep, len(nem.Episodes()))
	if rep.Acked == 0 {
		t.Errorf("no write was acknowledged: the run checked nothing")
	}
	if t.Failed() {
		for _, e := range nem.Episodes() {
			t.Logf("  episode: %s", e)
		}
	}
	c.CheckConverged(t, run.Paths(), 60*time.Second)
	return rep
}
