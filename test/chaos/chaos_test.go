// Package chaos holds the in-process cluster tests: counterparts of the MIT
// 6.824 lab 3 tests (basic, concurrent, unreliable, one partition, many
// partitions with one or many clients, persistence, snapshots, a leader
// killed during large writes), each with 3 and 5 nodes, each history checked
// for linearizability with porcupine.
//
// `go test ./test/chaos/` is the CI set (a few seconds per scenario);
// `go test -tags chaos -run TestSoak ./test/chaos/` (make chaos) is the soak.
package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/workload"
)

// connectTo returns a workload.Connect for an in-process cluster.
func connectTo(c *harness.Cluster) workload.Connect {
	return func(ctx context.Context, name string) (*client.Client, error) {
		return c.Client(ctx, name, nil, client.WithAttemptTimeout(time.Second))
	}
}

// cacherLease is the session lease of the caching readers: how long a
// frozen or dead one holds up other sessions' commands at most. Short, so
// that a freeze of a few seconds gets its capabilities revoked.
const cacherLease = 2 * time.Second

// caching configures n caching clients on an in-process cluster, each
// with two concurrent readers (as a mount serves concurrent requests), a
// fifth of whose operations change things through the mount; the first
// buffered of them buffer (fsops.Options{Buffered: true}), and change
// things in two operations of five: what a buffering mount is for.
func caching(c *harness.Cluster, n, buffered int) *workload.Caching {
	return &workload.Caching{Readers: n, Workers: 2, Writes: 0.2, Buffered: buffered, BufferedWrites: 0.4,
		Lease: cacherLease, Dialer: c.Dialer,
		Connect: func(ctx context.Context, name string, opts ...client.Option) (*client.Client, error) {
			return c.Client(ctx, name, nil, opts...)
		}}
}

// cacherFaults are what the nemesis does to caching readers: freezes
// (weighted twice) and kills.
var cacherFaults = []workload.Fault{workload.FreezeCacher, workload.FreezeCacher, workload.KillCacher}

// Fault sets of the scenarios.
var (
	partitions = []workload.Fault{workload.PartitionHalves, workload.IsolateLeader,
		workload.Bridge, workload.OneWay, workload.LeaderOneWay}
	clientFaults = []workload.Fault{workload.ClientCut, workload.ResetConns}
	crashes      = []workload.Fault{workload.CrashOne, workload.CrashLeader,
		workload.CrashMinority, workload.CrashAll}
)

func join(sets ...[]workload.Fault) []workload.Fault {
	var out []workload.Fault
	for _, s := range sets {
		out = append(out, s...)
	}
	return out
}

// scenario is one of the 6.824-style tests.
type scenario struct {
	name    string
	clients int
	workers int // per client
	storage harness.Storage
	faults  []workload.Fault
	lossy   bool // an unreliable network for the whole run
	// dataFiles, when not 0, spreads the data operations over more files:
	// each operation whose outcome is unknown multiplies the orders
	// porcupine must try on its key, so many of them on one key can make a
	// check run out of time.
	dataFiles int
	// cachers are caching readers (workload.CachingReader) beside the
	// clients: operations through the FUSE layer's metadata cache under
	// capabilities, which every other client's change to what they hold
	// must recall first.
	cachers int
	// buffered of the cachers mount with buffered metadata: their
	// creates, mkdirs and renames are answered before the cluster has
	// them, and count once a sync confirms them.
	buffered int
	// script, when set, is the nemesis's order of faults (cycling)
	// instead of a random draw from faults.
	script []workload.Fault
}

var scenarios = []scenario{
	{name: "Basic", clients: 1},
	{name: "Concurrent", clients: 5, workers: 2},
	{name: "Unreliable", clients: 5, lossy: true},
	{name: "ManyPartitionsOneClient", clients: 1, faults: partitions},
	{name: "ManyPartitionsManyClients", clients: 5, faults: join(partitions, clientFaults)},
	{name: "PersistOneClient", clients: 1, faults: crashes},
	{name: "PersistConcurrent", clients: 5, faults: crashes},
	{name: "PersistPartitionUnreliable", clients: 5, faults: join(crashes, partitions, clientFaults), lossy: true},
	{name: "PersistInMemoryStores", clients: 3, storage: harness.Memory, faults: join(crashes, partitions)},
	{name: "EphemeralMinorityCrashes", clients: 3, storage: harness.Ephemeral, faults: []workload.Fault{workload.CrashOne, workload.CrashLeader}},
	// Not in 6.824: the leader's clock jumps, so session leases run out
	// under the clients' feet in the middle of their retries.
	{name: "ClockJumps", clients: 4, workers: 2, dataFiles: 8, faults: []workload.Fault{workload.ClockJump, workload.CrashLeader, workload.IsolateLeader}},
	// Not in 6.824: plain clients change what caching readers hold, so
	// their commands wait for recalls, while partitions, crashes, lossy
	// links, and freezes and kills of the readers themselves delay or
	// lose the recalls, releases and renewals.
	{name: "CachingReaders", clients: 3, cachers: 2,
		faults: join(partitions, clientFaults, crashes, []workload.Fault{workload.Unreliable}, cacherFaults)},
}

// clockFree reports whether sc keeps the clock assumption capabilities
// rest on (docs/protocol.md: the nodes' clocks agree within the trust
// margin and do not jump by more); caching readers join only those.
func (sc scenario) clockFree() bool {
	for _, f := range sc.faults {
		if f == workload.ClockJump {
			return false
		}
	}
	return true
}

// variant is a cluster shape every scenario runs in.
type variant struct {
	nodes int
	snap  bool
}

func (v variant) String() string {
	if v.snap {
		return fmt.Sprintf("n%d-snap", v.nodes)
	}
	return fmt.Sprintf("n%d", v.nodes)
}

func variants() []variant {
	if testing.Short() {
		return []variant{{3, false}, {5, true}}
	}
	return []variant{{3, false}, {5, false}, {3, true}, {5, true}}
}

// duration is how long the CI set runs each history; -short halves it.
func duration() time.Duration {
	if testing.Short() {
		return 1500 * time.Millisecond
	}
	return 3 * time.Second
}

// options builds the cluster options of a variant. The snapshot variant
// snapshots every few dozen entries and keeps a short log tail, so that a
// follower that falls behind (partitioned, crashed) is sent a snapshot.
func options(v variant, storage harness.Storage, seed int64) harness.Options {
	o := harness.Options{Nodes: v.nodes, Seed: seed, Storage: storage}
	if v.snap {
		o.SnapshotThreshold, o.TrailingLogs = 40, 10
		o.Tune = func(t *server.RaftTuning) { t.SnapshotInterval = 200 * time.Millisecond }
	}
	return o
}

func TestScenarios(t *testing.T) {
	for _, sc := range scenarios {
		for _, v := range variants() {
			t.Run(sc.name+"/"+v.String(), func(t *testing.T) {
				t.Parallel()
				runScenario(t, sc, v, duration(), "")
			})
		}
	}
}

// runScenario runs one history of sc on a fresh cluster shaped by v.
func runScenario(t *testing.T, sc scenario, v variant, d time.Duration, prefix string) workload.Outcome {
	seed := workload.Seed(t)
	c := harness.Start(t, options(v, sc.storage, seed))
	return runHistory(t, c, sc, v, seed, d, prefix)
}

// runHistory runs one history of sc on cluster c, its keys under prefix,
// checks it, and checks that the healed replicas converge.
func runHistory(t *testing.T, c *harness.Cluster, sc scenario, v variant, seed int64, d time.Duration, prefix string) workload.Outcome {
	r := workload.Run{
		Clients: sc.clients, WorkersPerClient: sc.workers, Duration: d,
		Workload: workload.Config{DataFiles: 3, Groups: 2, OpTimeout: 4 * time.Second, Prefix: prefix},
	}
	if sc.clients == 1 {
		r.Workload.DataFiles, r.Workload.Groups = 2, 1
	}
	if sc.dataFiles > 0 {
		r.Workload.DataFiles = sc.dataFiles
	}
	if len(sc.faults) > 0 || len(sc.script) > 0 || sc.lossy {
		r.Nemesis = &workload.Nemesis{
			Faults:  sc.faults,
			Script:  sc.script,
			HoldMin: 200 * time.Millisecond, HoldMax: 1500 * time.Millisecond,
			CalmMin: 100 * time.Millisecond, CalmMax: 600 * time.Millisecond,
			Lossy: workload.DefaultLossy, Always: sc.lossy,
			// Long enough, often, for a frozen reader's capabilities
			// to be revoked.
			FreezeMin: cacherLease / 2, FreezeMax: 2 * cacherLease,
		}
	}
	if sc.cachers > 0 {
		r.Caching = caching(c, sc.cachers, sc.buffered)
	}
	out := r.Execute(t, seed, c, connectTo(c))
	if t.Failed() && sc.storage == harness.Memory {
		// The in-memory logs show whether a request was appended twice.
		var b strings.Builder
		n := c.DuplicateCommands(&b)
		t.Logf("%d commands appear at more than one log index:\n%s", n, b.String())
	}
	if v.snap {
		logSnapshots(t, c)
	}
	c.CheckConverged(t, workloadPaths(r.Workload), 60*time.Second)
	return out
}

// workloadPaths lists the keys of a workload, for the replica comparison.
func workloadPaths(w workload.Config) []string {
	var out []string
	for i := 0; i < w.DataFiles; i++ {
		out = append(out, w.DataKey(i))
	}
	for i := 0; i < w.Groups; i++ {
		out = append(out, w.GroupKey(i))
	}
	return out
}

func logSnapshots(t *testing.T, c *harness.Cluster) {
	t.Logf("snapshots: %d InstallSnapshot RPCs sent; last snapshot index per node %v",
		c.Net.Stats.Snapshots.Load(), c.SnapshotIndexes())
}
