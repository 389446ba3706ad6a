package server_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// trafficOf returns every running node's counters by id.
func trafficOf(c *servertest.Cluster) map[string]server.Traffic {
	out := map[string]server.Traffic{}
	for _, n := range c.Nodes() {
		out[n.ID()] = n.Traffic()
	}
	return out
}

// settle waits until every node has applied what the leader has.
func settle(t *testing.T, c *servertest.Cluster) {
	t.Helper()
	c.WaitApplied(c.WaitLeader(10*time.Second).AppliedIndex(), 30*time.Second)
}

// TestWireDedup writes the same 2 MiB twice (streamed) and a half-new
// 1 MiB once, with dedup on the wire and without, and checks what reached
// every node's log and the network, and that every node stores each
// unique byte once either way.
func TestWireDedup(t *testing.T) {
	const size = 2 << 20
	for _, tc := range []struct {
		name    string
		disable bool
	}{{"on", false}, {"off", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := servertest.StartCluster(t, 3, servertest.WithEphemeral(), servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
				cfg.DisableWireDedup = tc.disable
			}))
			s := openSession(t, c.Client(c.WaitLeader(10*time.Second).APIAddr()))
			data := server.RandomBytes(size, 1)
			s.create("/a")
			s.streamWrite("/a", data, 1<<20)
			s.create("/b")
			s.create("/c")
			settle(t, c)
			before := trafficOf(c)

			s.streamWrite("/b", data, 1<<20)
			half := append(append([]byte(nil), data[:512<<10]...), server.RandomBytes(512<<10, 2)...)
			s.write("/c", 0, half)
			settle(t, c)
			after := trafficOf(c)

			var sent, deduped uint64
			for id, a := range after {
				b := before[id]
				logged := a.LogBytes - b.LogBytes
				if tc.disable {
					require.GreaterOrEqual(t, logged, uint64(size+1<<20), "node %s log", id)
				} else {
					// The half-new write's new half, plus hashes and framing.
					require.GreaterOrEqual(t, logged, uint64(512<<10), "node %s log", id)
					require.Less(t, logged, uint64(512<<10+64<<10), "node %s log", id)
				}
				sent += a.NetSent - b.NetSent
				deduped += a.DedupBytes - b.DedupBytes
			}
			if tc.disable {
				require.GreaterOrEqual(t, sent, uint64(2*(size+1<<20)), "to two followers")
				require.Zero(t, deduped)
			} else {
				require.Less(t, sent, uint64(2*(512<<10)+256<<10))
				require.Equal(t, uint64(size+512<<10), deduped)
			}
			st, err := c.Client(c.Nodes()[1].APIAddr()).Status(ctxTimeout(t, 10*time.Second), &pb.StatusRequest{Version: pb.Version})
			require.NoError(t, err)
			require.Len(t, st.Nodes, 3)
			for _, ns := range st.Nodes {
				require.Empty(t, ns.Error)
				require.Equal(t, uint64(size+512<<10), ns.PhysicalBytes, "status of %s", ns.Id)
				require.Equal(t, uint64(2*size+1<<20), ns.LogicalBytes, "status of %s", ns.Id)
				require.Equal(t, uint64(size), ns.SharedBytes, "status of %s", ns.Id) // /a and /b share everything
				require.Positive(t, ns.LogBytes)
				require.Positive(t, ns.NetSentBytes)
				require.Positive(t, ns.NetReceivedBytes)
			}
			require.Equal(t, uint64(size), st.SharedBytes)
			require.Equal(t, uint64(2*size+1<<20), st.RefBytes)
			for _, n := range c.Nodes() {
				st := n.FSM().Stats()
				require.Equal(t, uint64(size+512<<10), st.Block.PhysicalBytes, "node %s", n.ID())
				require.Equal(t, data, readAll(t, c.Client(n.APIAddr()), "/b", pb.Consistency_STALE))
				require.Equal(t, half, readAll(t, c.Client(n.APIAddr()), "/c", pb.Consistency_STALE))
			}
		})
	}
}

// TestWireDedupResendsWhenBlockFreed races by-hash writes against the
// removal of the only other file holding their block. Whenever the block
// goes between the leader's check and the apply, every replica refuses the
// entry (EREMOTEIO) and the leader resends the data: the client sees
// every write succeed with the right content, and nothing else.
func TestWireDedupResendsWhenBlockFreed(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	chunk := server.RandomBytes(64<<10, 3) // one default-size chunk
	put := func(path string) *pb.Command {
		return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: &pb.Loc{Path: path}, Data: chunk, Create: true, Truncate: true, Mode: 0o644}}}
	}
	rm := func(path string) *pb.Command {
		return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Path: path}}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		s := openSession(t, cli)
		wg.Go(func() {
			path := fmt.Sprintf("/w%d", w)
			read := &pb.QueryRequest{Version: pb.Version, Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{
				Loc: &pb.Loc{Path: path}, Length: 1 << 20}}}}
			// Until both paths were taken: the first by-hash write may
			// itself be the one refused and resent.
			for tr := leader.Traffic(); ctx.Err() == nil && (tr.DedupResends == 0 || tr.DedupCommands == 0); tr = leader.Traffic() {
				res, err := s.tryApply(put(path))
				if !assertOK(t, res, err, "write %s", path) {
					return
				}
				var got *pb.QueryResponse
				err = retryUnavailable(func(ctx context.Context) error {
					got, err = cli.Query(ctx, read)
					return err
				})
				if !assertOK(t, got.GetResult(), err, "read %s", path) || !assertSame(t, chunk, got.Result.Data, path) {
					return
				}
				if res, err = s.tryApply(rm(path)); !assertOK(t, res, err, "remove %s", path) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "no write raced with a removal, or none went by hash, within the time")
	tr := leader.Traffic()
	require.Positive(t, tr.DedupResends)
	require.Positive(t, tr.DedupCommands, "some writes went by hash")
	t.Logf("by hash: %d writes, resent with data: %d", tr.DedupCommands, tr.DedupResends)
}

func assertOK(t *testing.T, r *pb.Result, err error, format string, args ...any) bool {
	t.Helper()
	what := fmt.Sprintf(format, args...)
	return assert(t, err == nil, "%s: %v", what, err) &&
		assert(t, r.GetErrno() == 0, "%s: errno %d: %s", what, r.GetErrno(), r.GetMessage())
}

func assertSame(t *testing.T, want, got []byte, what string) bool {
	t.Helper()
	return assert(t, string(want) == string(got), "%s: content differs (%d bytes read)", what, len(got))
}

// assert reports a failure from a goroutine other than the test's.
func assert(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// TestLeaderBudgetAppliesEverywhere gives the three nodes different memory
// limits. The leader stamps its own on every entry, so all replicas refuse
// the same writes and end with the same data and the same budget.
func TestLeaderBudgetAppliesEverywhere(t *testing.T) {
	limits := []uint64{1 << 20, 2 << 20, 3 << 20}
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral(), servertest.WithNodeConfig(func(i int, cfg *server.Config) {
		cfg.MemoryLimit = limits[i]
	}))
	s := openSession(t, c.Client(c.WaitLeader(10*time.Second).APIAddr()))
	refused := 0
	for i := range 8 {
		path := fmt.Sprintf("/f%d", i)
		s.create(path)
		if errnoOf(s.apply(server.WriteCmd(path, 0, server.RandomBytes(512<<10, byte(10+i))))) == syscall.ENOSPC {
			refused++
		}
	}
	require.Positive(t, refused, "8 × 512 KiB exceed every limit")
	settle(t, c)
	leader := c.WaitLeader(10 * time.Second)
	want := leader.FSM().Stats()
	require.Contains(t, limits, want.Block.Limit)
	require.LessOrEqual(t, want.Block.PhysicalBytes, want.Block.Limit)
	for _, n := range c.Nodes() {
		got := n.FSM().Stats()
		require.Equal(t, want.Block, got.Block, "node %s", n.ID())
		require.Equal(t, want.LogicalBytes, got.LogicalBytes, "node %s", n.ID())
	}
}
