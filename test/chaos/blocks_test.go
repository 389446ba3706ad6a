package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// The block layer's tests (dedup, snapshots, block sync) under the fault-injection harness
// (the server package has each of them on a reliable network):
// incremental snapshot chains restored after every node is killed, and a
// block corrupted on disk repaired from a peer, while clients work and
// every link, node to node included, loses, delays and duplicates
// messages. Catch-up under faults is TestSnapshotInstallUnderFaults,
// replacement TestReplaceUnderFaults.

// TestIncrementalChainKillAllUnderFaults changes part of the bulk data and
// snapshots every node, in rounds (each snapshot writes only new blocks),
// then kills every node (no final snapshot) and restarts them.
func TestIncrementalChainKillAllUnderFaults(t *testing.T) {
	forBlockRuns(t, func(ctx context.Context, t *testing.T, c *harness.Cluster, run *blockRun) {
		c.Net.SetDefault(workload.DefaultLossy)
		for round := 1; round <= 3; round++ {
			// Rewrite one file of the bulk data: the next snapshot
			// writes its blocks and no other.
			p := run.bulk[round%len(run.bulk)]
			run.want[p] = bulkData(p, round, len(run.want[p]))
			require.NoError(t, run.setup.WithContext(ctx).WriteFile(p, run.want[p], 0o644))
			snapshotAll(ctx, t, c, run.setup)
		}
		for i := range c.Size() {
			c.Crash(i)
		}
		for i := range c.Size() {
			require.NoError(t, c.Restart(i))
		}
		c.WaitLeader(60 * time.Second)
	})
}

// TestCorruptBlockOnDiskRepairedUnderFaults flips a byte of a bulk file's
// block in a stopped follower's pack file; restarted under faults, it must find the
// block bad and fetch it whole from a peer.
func TestCorruptBlockOnDiskRepairedUnderFaults(t *testing.T) {
	forBlockRuns(t, func(ctx context.Context, t *testing.T, c *harness.Cluster, run *blockRun) {
		snapshotAll(ctx, t, c, run.setup)

		victim := (c.WaitLeader(30*time.Second) + 1) % c.Size()
		c.Crash(victim)
		corruptBlock(t, filepath.Join(c.DataDir(victim), "blocks"), "/bulk/b2 version 0")
		c.Net.SetDefault(workload.DefaultLossy)
		require.NoError(t, c.Restart(victim))
		require.Eventually(t, func() bool {
			st, err := replace.LocalStatus(ctx, replace.Net{Dialer: c.Dialer("admin")}, c.APIAddr(victim))
			return err == nil && st.SyncCorruptBlocks >= 1
		}, 60*time.Second, 100*time.Millisecond, "the corrupt block was never noticed")
	})
}

// forBlockRuns runs body on a 3- and a 5-node cluster (disk storage, the
// snapshot variant) with a blockRun started, then finishes the run.
func forBlockRuns(t *testing.T, body func(context.Context, *testing.T, *harness.Cluster, *blockRun)) {
	for _, n := range []int{3, 5} {
		v := variant{nodes: n, snap: true}
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			seed := workload.Seed(t)
			c := harness.Start(t, options(v, harness.Disk, seed))
			ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
			defer cancel()
			run := startBlockRun(ctx, t, c, seed)
			body(ctx, t, c, run)
			run.finish(ctx, t, c, seed)
		})
	}
}

// blockRun is a workload over bulk data for the block tests.
type blockRun struct {
	cfg     workload.Config
	setup   *client.Client
	bulk    []string
	want    map[string][]byte
	rec     *model.Recorder
	st      *workload.Stats
	workers *workers
}

func startBlockRun(ctx context.Context, t *testing.T, c *harness.Cluster, seed int64) *blockRun {
	t.Helper()
	r := &blockRun{cfg: workload.Config{DataFiles: 2, Groups: 1, OpTimeout: 30 * time.Second, Seed: seed},
		want: map[string][]byte{}, rec: model.NewRecorder(), st: &workload.Stats{}}
	var err error
	r.setup, err = connectTo(c)(ctx, "setup")
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.setup.Close() })
	require.NoError(t, workload.Setup(ctx, r.setup, r.cfg))
	r.bulk = writeBulk(ctx, t, r.setup, 6, 192<<10)
	for _, p := range r.bulk {
		r.want[p] = bulkData(p, 0, 192<<10)
	}
	r.workers = startWorkers(ctx, t, c, r.cfg, r.rec, r.st, 2)
	return r
}

// finish heals the network, ends the history and checks it, the bulk
// data and the replicas.
func (r *blockRun) finish(ctx context.Context, t *testing.T, c *harness.Cluster, seed int64) {
	t.Helper()
	time.Sleep(time.Second) // the workload runs on the restarted cluster
	r.workers.stop()
	c.Net.Reliable()
	r.workers.readAll(ctx)
	t.Logf("workload: %v", r.st)
	model.Check(t, seed, r.rec.Operations())
	for _, p := range r.bulk {
		got, err := r.setup.WithContext(ctx).ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(r.want[p], got), "%s differs after the restart", p)
	}
	c.CheckConverged(t, append(workloadPaths(r.cfg), r.bulk...), 60*time.Second)
}

// bulkData is the content of bulk file p in version v: distinct per file
// and version, so that nothing dedups away.
func bulkData(p string, v, size int) []byte {
	data := bytes.Repeat([]byte{byte(v + 1)}, size)
	copy(data, fmt.Sprintf("%s version %d", p, v))
	return data
}

// corruptBlock flips a byte inside the block that starts with marker, in
// whichever pack file of dir holds it.
func corruptBlock(t *testing.T, dir, marker string) {
	t.Helper()
	packs, err := filepath.Glob(filepath.Join(dir, "*.pack"))
	require.NoError(t, err)
	for _, p := range packs {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		if i := bytes.Index(raw, []byte(marker)); i >= 0 {
			raw[i+len(marker)+10] ^= 0xff
			require.NoError(t, os.WriteFile(p, raw, 0o600))
			return
		}
	}
	t.Fatalf("no block starting with %q in the packs of %s", marker, dir)
}
