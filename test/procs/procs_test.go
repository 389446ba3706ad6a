package procs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/workload"
)

var memfsBin string

func TestMain(m *testing.M) {
	// The FUSE layer the caching readers go through (fuse/fsops) logs
	// every operation that fails with EIO at Warn, and under faults that
	// is every timeout.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	dir, err := os.MkdirTemp("", "memfs-procs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	memfsBin, err = Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func connectTo(c *Cluster) workload.Connect {
	return func(ctx context.Context, name string) (*client.Client, error) {
		return c.Client(ctx, name, client.WithAttemptTimeout(time.Second))
	}
}

// serverArgs make snapshots frequent, so that a node killed for a while
// is caught up with a snapshot.
var serverArgs = []string{"--snapshot-threshold", "64", "--trailing-logs", "16", "--snapshot-interval", "500ms"}

// streamLossy is the byte-stream fault set: delays and resets (a TCP
// stream cannot lose or duplicate bytes without breaking).
var streamLossy = faultsLossy()

// TestProcessesNemesis runs the linearizability workload against real
// processes while the nemesis partitions Raft links through the proxies,
// blackholes and resets client connections, slows every link, and kills
// the leader or every node with SIGKILL. The -caching variant adds two
// caching readers (workload.CachingReader), which the nemesis also freezes
// and kills, so the servers' recalls, revocations and session expiry are
// exercised across real process crashes.
func TestProcessesNemesis(t *testing.T) {
	for _, v := range []struct {
		nodes, cachers int
	}{{3, 0}, {5, 0}, {3, 2}} {
		name := fmt.Sprintf("n%d", v.nodes)
		if v.cachers > 0 {
			name += "-caching"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := workload.Seed(t)
			c := Start(t, memfsBin, Options{Nodes: v.nodes, Seed: seed, Args: serverArgs})
			processHistory(t, c, seed, duration(), "", v.cachers, 0)
		})
	}
}

// processFaults is everything the nemesis does to processes.
var processFaults = []workload.Fault{workload.PartitionHalves, workload.IsolateLeader, workload.OneWay,
	workload.Bridge, workload.LeaderOneWay, workload.Unreliable, workload.ClientCut, workload.ResetConns,
	workload.CrashLeader, workload.CrashAll, workload.CrashOne}

// cacherLease is the caching readers' session lease: short, so that a
// freeze of a few seconds gets a reader's capabilities revoked.
const cacherLease = 2 * time.Second

// processHistory runs and checks one history on c, its keys under prefix,
// with cachers caching readers beside the 4 clients, the first buffered of
// which buffer.
func processHistory(t *testing.T, c *Cluster, seed int64, d time.Duration, prefix string, cachers, buffered int) workload.Outcome {
	r := workload.Run{
		Clients: 4, Duration: d,
		Workload: workload.Config{DataFiles: 3, Groups: 2, OpTimeout: 5 * time.Second, Prefix: prefix},
		Nemesis: &workload.Nemesis{
			Faults:  processFaults,
			HoldMin: 300 * time.Millisecond, HoldMax: 2 * time.Second,
			CalmMin: 300 * time.Millisecond, CalmMax: time.Second,
			Lossy: streamLossy,
		},
	}
	if cachers > 0 {
		r.Nemesis.Faults = append(append([]workload.Fault(nil), processFaults...),
			workload.FreezeCacher, workload.FreezeCacher, workload.KillCacher)
		r.Nemesis.FreezeMin, r.Nemesis.FreezeMax = cacherLease/2, 2*cacherLease
		r.Caching = &workload.Caching{Readers: cachers, Workers: 2, Writes: 0.2, Buffered: buffered, BufferedWrites: 0.4,
			Lease: cacherLease, Dialer: c.Dialer, Connect: c.Client}
	}
	return r.Execute(t, seed, c, connectTo(c))
}

// TestProcessesKillAllDurability writes patterned files while the leader,
// then every node, is killed with SIGKILL and restarted: every
// acknowledged write must be there in full, every other one whole or
// absent.
func TestProcessesKillAllDurability(t *testing.T) {
	seed := workload.Seed(t)
	c := Start(t, memfsBin, Options{Nodes: 3, Seed: seed, Args: serverArgs})
	connect := connectTo(c)
	dur := workload.Durability{Writers: 3, Files: 40, Size: 1 << 20, Prefix: "/dur", OpTimeout: 3 * time.Second}
	wctx, wcancel := context.WithTimeout(context.Background(), duration()+20*time.Second)
	defer wcancel()
	run := dur.Execute(wctx, t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), duration())
	defer cancel()
	nem := &workload.Nemesis{T: c, Script: []workload.Fault{workload.CrashLeader, workload.CrashAll},
		Clients: dur.Names(), Logf: t.Logf,
		HoldMin: 100 * time.Millisecond, HoldMax: 800 * time.Millisecond,
		CalmMin: 500 * time.Millisecond, CalmMax: 1500 * time.Millisecond}
	err := nem.Run(ctx)
	run.FaultsOver()
	if err != nil {
		t.Fatalf("nemesis: %v", err)
	}
	run.Wait()
	rep := run.Verify(t, connect)
	t.Logf("durability: %+v after %v", rep, nem.Episodes())
	if rep.Acked == 0 {
		t.Errorf("no write was acknowledged: the run checked nothing")
	}
}

func duration() time.Duration {
	if testing.Short() {
		return 3 * time.Second
	}
	return 6 * time.Second
}
