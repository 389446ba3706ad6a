package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// TestReplaceUnderFaults replaces a member (a follower, or the leader) by
// a new node while clients go on working over a lossy network (loss,
// delay, duplication and resets on every link, node to node included, so
// block sync and the snapshot install run under faults too). The history
// must stay linearizable, a steady writer must see no failed write and
// find each of its files afterwards, and the new configuration's replicas
// must agree, bulk data included.
func TestReplaceUnderFaults(t *testing.T) {
	for _, n := range []int{3, 5} {
		for _, leader := range []bool{false, true} {
			v := variant{nodes: n, snap: true}
			name := v.String() + "-follower"
			if leader {
				name = v.String() + "-leader"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				replaceUnderFaults(t, v, leader)
			})
		}
	}
}

func replaceUnderFaults(t *testing.T, v variant, replaceLeader bool) {
	seed := workload.Seed(t)
	c := harness.Start(t, options(v, harness.Disk, seed))
	cfg := workload.Config{DataFiles: 2, Groups: 1, OpTimeout: 30 * time.Second, Seed: seed}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	setup, err := connectTo(c)(ctx, "setup")
	require.NoError(t, err)
	defer setup.Close()
	require.NoError(t, workload.Setup(ctx, setup, cfg))
	bulk := writeBulk(ctx, t, setup, 6, 192<<10)

	rec, st := model.NewRecorder(), &workload.Stats{}
	workers := startWorkers(ctx, t, c, cfg, rec, st, 2)
	writer := startSteadyWriter(ctx, t, c)
	c.Net.SetDefault(workload.DefaultLossy)

	old := c.WaitLeader(30 * time.Second)
	if !replaceLeader {
		old = (old + 1) % v.nodes
	}
	// A snapshot on every node cuts the log: the new node must be sent a
	// snapshot and fetch the bulk data by block sync, under the faults.
	snapshotAll(ctx, t, c, setup)
	members := c.APIAddrs()
	spare, err := c.AddSpare()
	require.NoError(t, err)
	sum, err := replace.Run(ctx, replace.Options{
		Old:     c.IDs()[old],
		New:     replace.Target{ID: c.IDs()[spare], RaftAddr: c.RaftAddr(spare), APIAddr: c.APIAddr(spare)},
		Cluster: members, Dialer: c.Dialer("admin"),
		Stable: 500 * time.Millisecond, StepTimeout: 30 * time.Second, CatchUpTimeout: 120 * time.Second,
	})
	require.NoError(t, err, "replace %s", c.IDs()[old])
	t.Logf("replaced %s by %s in %v (catch-up %v): %d blocks, %d bytes by block sync, %d bytes over Raft; leader %s",
		sum.Old, sum.New, sum.Elapsed, sum.CatchUp, sum.SyncBlocks, sum.SyncBytes, sum.RaftBytes, sum.Leader)
	require.NotContains(t, sum.Voters, sum.Old)
	require.Contains(t, sum.Voters, sum.New)
	require.NotZero(t, sum.SyncBlocks, "the new node fetched no block by block sync")
	c.Retire(old)

	// The new configuration keeps serving under faults for a while.
	time.Sleep(time.Second)
	workers.stop()
	acked, failed := writer.stop()
	c.Net.Reliable()
	workers.readAll(ctx)
	t.Logf("workload: %v; steady writer: %d acknowledged, %d failed", st, len(acked), len(failed))
	require.Empty(t, failed, "the steady writer saw failed writes")
	model.Check(t, seed, rec.Operations())
	c.CheckConverged(t, append(workloadPaths(cfg), append(bulk, acked...)...), 60*time.Second)
	checkFiles(ctx, t, setup, acked)
}

// snapshotAll makes every running node take a snapshot that covers a new
// entry (a write made just before), so that every log is cut.
func snapshotAll(ctx context.Context, t *testing.T, c *harness.Cluster, cl *client.Client) {
	t.Helper()
	for _, i := range c.Up() {
		require.NoError(t, cl.WithContext(ctx).WriteFile(fmt.Sprintf("/bulk/mark%d", i), nil, 0o644))
		n := c.Node(i)
		require.Eventually(t, func() bool {
			return n.WaitApplied(ctx, c.Node(c.WaitLeader(30*time.Second)).AppliedIndex()) == nil &&
				n.Raft().Snapshot().Error() == nil
		}, 60*time.Second, 50*time.Millisecond, "snapshot of %s", n.ID())
	}
}

// writeBulk writes n files of size random bytes under /bulk: data the new
// node must fetch by block sync once a snapshot has replaced the log.
func writeBulk(ctx context.Context, t *testing.T, cl *client.Client, n, size int) []string {
	t.Helper()
	require.NoError(t, cl.WithContext(ctx).MkdirAll("/bulk", 0o755))
	var paths []string
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("/bulk/b%d", i)
		require.NoError(t, cl.WithContext(ctx).WriteFile(p, bulkData(p, 0, size), 0o644))
		paths = append(paths, p)
	}
	return paths
}

// workers are the linearizability workload's clients.
type workers struct {
	ws     []*workload.Worker
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startWorkers(ctx context.Context, t *testing.T, c *harness.Cluster, cfg workload.Config,
	rec *model.Recorder, st *workload.Stats, n int) *workers {
	t.Helper()
	run, cancel := context.WithCancel(ctx)
	w := &workers{cancel: cancel}
	for i := 0; i < n; i++ {
		cl, err := connectTo(c)(ctx, fmt.Sprintf("c%d", i))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		wk := workload.NewWorker(i, cl, cfg, rec, st)
		w.ws = append(w.ws, wk)
		w.wg.Add(1)
		go func() { defer w.wg.Done(); wk.Run(run) }()
	}
	return w
}

func (w *workers) stop() {
	w.cancel()
	w.wg.Wait()
}

// readAll ends the history with a read of every key by every worker.
func (w *workers) readAll(ctx context.Context) {
	for _, wk := range w.ws {
		w.wg.Add(1)
		go func() { defer w.wg.Done(); wk.ReadAll(ctx) }()
	}
	w.wg.Wait()
	for _, wk := range w.ws {
		wk.WaitClosers()
	}
}

// steadyWriter writes one new file after another, each with the whole
// retry deadline of the client: under faults and a membership change none
// may fail.
type steadyWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
	acked  []string
	failed []string
}

func startSteadyWriter(ctx context.Context, t *testing.T, c *harness.Cluster) *steadyWriter {
	t.Helper()
	cl, err := c.Client(ctx, "writer", nil, client.WithAttemptTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	require.NoError(t, cl.WithContext(ctx).MkdirAll("/steady", 0o755))
	run, cancel := context.WithCancel(ctx)
	w := &steadyWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; run.Err() == nil; i++ {
			p := fmt.Sprintf("/steady/w%d", i)
			op, stop := context.WithTimeout(ctx, 60*time.Second) // not run: a write in flight ends
			err := cl.WithContext(op).WriteFile(p, []byte(p), 0o644)
			stop()
			if err != nil {
				w.failed = append(w.failed, fmt.Sprintf("%s: %v", p, err))
			} else {
				w.acked = append(w.acked, p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

func (w *steadyWriter) stop() (acked, failed []string) {
	w.cancel()
	<-w.done
	return w.acked, w.failed
}

// checkFiles reads back every acknowledged file of the steady writer.
func checkFiles(ctx context.Context, t *testing.T, cl *client.Client, paths []string) {
	t.Helper()
	for _, p := range paths {
		got, err := cl.WithContext(ctx).ReadFile(p)
		require.NoError(t, err, "acknowledged %s", p)
		require.Equal(t, p, string(got))
	}
}
