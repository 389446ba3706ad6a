package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// TestRetryAcrossSnapshotRestart checks that the duplicate-request table
// survives a snapshot and a restart of every node: an append is applied
// but its reply is held back, every node snapshots (so the entry is no
// longer replayed from the log), every node is killed and restarted, and
// then the client's retry of the same request must not apply it again.
func TestRetryAcrossSnapshotRestart(t *testing.T) {
	for _, n := range []int{3, 5} {
		for _, storage := range []harness.Storage{harness.Disk, harness.Memory} {
			t.Run(variant{nodes: n}.String()+"-"+storage.String(), func(t *testing.T) {
				t.Parallel()
				retryAcrossSnapshotRestart(t, n, storage)
			})
		}
	}
}

func retryAcrossSnapshotRestart(t *testing.T, nodes int, storage harness.Storage) {
	seed := workload.Seed(t)
	c := harness.Start(t, harness.Options{Nodes: nodes, Seed: seed, Storage: storage, TrailingLogs: 4})
	cfg := workload.Config{DataFiles: 1, OpTimeout: 90 * time.Second, Seed: seed}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	setup, err := connectTo(c)(ctx, "setup")
	require.NoError(t, err)
	require.NoError(t, workload.Setup(ctx, setup, cfg))
	_ = setup.Close()

	cl, err := c.Client(ctx, "c0", nil, client.WithAttemptTimeout(500*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	rec, st := model.NewRecorder(), &workload.Stats{}
	w := workload.NewWorker(0, cl, cfg, rec, st)
	key := cfg.DataKey(0)
	appendOp := func(s string) model.Input { return model.Input{Kind: model.KindAppend, Key: key, Data: s} }
	require.NoError(t, w.Do(ctx, appendOp("<first>")))

	// Hold back every reply to the client.
	for _, id := range c.IDs() {
		c.Net.Block(id, "c0")
	}
	done := make(chan error, 1)
	go func() { done <- w.Do(ctx, appendOp("<once>")) }()
	require.Eventually(t, func() bool { return strings.Contains(leaderFile(c, key), "<once>") },
		30*time.Second, 10*time.Millisecond, "the append was never applied")

	for i := range c.IDs() {
		if n := c.Node(i); n != nil {
			require.NoError(t, n.Raft().Snapshot().Error(), "snapshot of node %d", i)
		}
	}
	for i := range c.IDs() {
		c.Crash(i)
	}
	for i := range c.IDs() {
		require.NoError(t, c.Restart(i))
	}
	c.WaitLeader(60 * time.Second)
	c.Net.Heal()

	require.NoError(t, <-done, "the retried append failed")
	require.NoError(t, w.Do(ctx, model.Input{Kind: model.KindRead, Key: key, Len: 1 << 20}))
	got := leaderFile(c, key)
	require.Equal(t, 1, strings.Count(got, "<once>"), "the retried append was applied %d times: %q", strings.Count(got, "<once>"), got)
	model.Check(t, seed, rec.Operations())
}

// leaderFile returns the contents of path in the leader's state machine.
func leaderFile(c *harness.Cluster, path string) string {
	l := c.Leader()
	if l < 0 {
		return ""
	}
	n := c.Node(l)
	if n == nil {
		return ""
	}
	res := n.FSM().Query(&pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: path}, Length: 1 << 20}}})
	return string(res.GetData())
}

// TestSnapshotInstallUnderFaults cuts a follower off, writes until the
// others have snapshotted past what it has, and heals it on a lossy
// network: it must be caught up by InstallSnapshot (which the transport
// counts) while messages are lost, delayed and duplicated, and the history
// and the replicas must stay right.
func TestSnapshotInstallUnderFaults(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(variant{nodes: n, snap: true}.String(), func(t *testing.T) {
			t.Parallel()
			seed := workload.Seed(t)
			c := harness.Start(t, options(variant{nodes: n, snap: true}, harness.Disk, seed))
			cfg := workload.Config{DataFiles: 2, Groups: 1, OpTimeout: 30 * time.Second, Seed: seed}
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			cl, err := connectTo(c)(ctx, "c0")
			require.NoError(t, err)
			defer cl.Close()
			require.NoError(t, workload.Setup(ctx, cl, cfg))
			rec, st := model.NewRecorder(), &workload.Stats{}
			w := workload.NewWorker(0, cl, cfg, rec, st)

			leader := c.WaitLeader(30 * time.Second)
			lagger := (leader + 1) % n
			c.Net.Isolate(c.IDs()[lagger], c.IDs())
			start := c.SnapshotIndexes()[leader]
			for i := 0; ctx.Err() == nil; i++ {
				w.Step(ctx)
				if c.SnapshotIndexes()[leader] > start+50 && i > 200 {
					break
				}
			}
			c.Net.SetDefault(workload.DefaultLossy)
			c.Net.Heal()
			require.Eventually(t, func() bool { return c.Net.Stats.Snapshots.Load() > 0 },
				60*time.Second, 20*time.Millisecond, "no snapshot was sent to the lagging node")
			for i := 0; i < 100; i++ {
				w.Step(ctx)
			}
			c.Net.Reliable()
			w.ReadAll(ctx)
			t.Logf("workload: %v; %d InstallSnapshot RPCs", st, c.Net.Stats.Snapshots.Load())
			model.Check(t, seed, rec.Operations())
			c.CheckConverged(t, workloadPaths(cfg), 60*time.Second)
		})
	}
}
