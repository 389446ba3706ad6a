package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// TestOnePartition is the counterpart of 6.824's TestOnePartition: with
// the leader in a majority and the rest cut off, clients of the majority
// make progress, clients of the minority do not, and once healed the
// minority's pending operations complete and everyone agrees. The whole
// history is checked for linearizability.
func TestOnePartition(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			onePartition(t, v)
		})
	}
}

func onePartition(t *testing.T, v variant) {
	seed := workload.Seed(t)
	c := harness.Start(t, options(v, harness.Disk, seed))
	cfg := workload.Config{DataFiles: 1, Groups: 1, OpTimeout: 30 * time.Second, Seed: seed}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	connect := connectTo(c)
	setup, err := connect(ctx, "setup")
	require.NoError(t, err)
	require.NoError(t, workload.Setup(ctx, setup, cfg))
	_ = setup.Close()

	// The leader and enough followers for a majority on one side.
	ids := c.IDs()
	leader := c.WaitLeader(30 * time.Second)
	maj := []int{leader}
	var min []int
	for i := range ids {
		if i != leader {
			if len(maj) < len(ids)/2+1 {
				maj = append(maj, i)
			} else {
				min = append(min, i)
			}
		}
	}
	rec, st := model.NewRecorder(), &workload.Stats{}
	worker := func(id int, name string, nodes []int) *workload.Worker {
		cl, err := c.Client(ctx, name, nodes, client.WithAttemptTimeout(time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return workload.NewWorker(id, cl, cfg, rec, st)
	}
	all := worker(0, "c-all", nil)
	ckMaj := worker(1, "c-maj", maj)
	ckMin1 := worker(2, "c-min1", min)
	ckMin2 := worker(3, "c-min2", min)

	key, group := cfg.DataKey(0), cfg.GroupKey(0)
	appendOp := func(s string) model.Input { return model.Input{Kind: model.KindAppend, Key: key, Data: s} }
	readOp := model.Input{Kind: model.KindRead, Key: key, Len: 1 << 20}
	require.NoError(t, all.Do(ctx, appendOp("<init>")))
	require.NoError(t, ckMin1.Do(ctx, model.Input{Kind: model.KindMkdir, Key: group, Path: "a", Perm: 0o755}))

	majSide, minSide := []string{"c-maj"}, []string{"c-min1", "c-min2"}
	for _, i := range maj {
		majSide = append(majSide, ids[i])
	}
	for _, i := range min {
		minSide = append(minSide, ids[i])
	}
	c.Net.Partition(majSide, minSide)

	// Wait until the minority has lost the leader, so nothing it holds
	// can still be forwarded across the cut.
	require.Eventually(t, func() bool {
		for _, i := range min {
			if n := c.Node(i); n != nil {
				if id, _ := n.Leader(); id != "" {
					return false
				}
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the minority still follows a leader")

	require.NoError(t, ckMaj.Do(ctx, appendOp("<maj1>")), "the majority makes progress")

	minDone := make(chan error, 2)
	go func() { minDone <- ckMin1.Do(ctx, appendOp("<min1>")) }()
	go func() {
		minDone <- ckMin2.Do(ctx, model.Input{Kind: model.KindRename, Key: group, Path: "a", Path2: "b"})
	}()

	require.NoError(t, ckMaj.Do(ctx, appendOp("<maj2>")))
	require.NoError(t, ckMaj.Do(ctx, readOp))
	require.NoError(t, ckMaj.Do(ctx, model.Input{Kind: model.KindStat, Key: group, Path: "a"}))

	// However long we look, the minority must not complete an operation.
	hold := time.NewTimer(time.Second)
	select {
	case err := <-minDone:
		t.Fatalf("an operation completed in the minority: %v", err)
	case <-hold.C:
	}

	c.Net.Heal()
	for k := 0; k < 2; k++ {
		require.NoError(t, <-minDone, "a minority operation failed after healing")
	}
	for _, w := range []*workload.Worker{all, ckMaj, ckMin1, ckMin2} {
		require.NoError(t, w.Do(ctx, readOp))
		require.NoError(t, w.Do(ctx, model.Input{Kind: model.KindReadDir, Key: group}))
	}
	t.Logf("workload: %v", st)
	model.Check(t, seed, rec.Operations())
	c.CheckConverged(t, workloadPaths(cfg), 60*time.Second)
}
