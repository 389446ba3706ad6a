package server_test

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
	"github.com/stretchr/testify/require"
)

// Writes many times the log's byte bound: every node's log must stay near
// the bound (entries alone would keep 2048 of them), and a node added
// afterwards gets the snapshot that replaced them and reads every file.
func TestLogBoundedInBytes(t *testing.T) {
	for _, ephemeral := range []bool{true, false} {
		t.Run(fmt.Sprintf("ephemeral=%v", ephemeral), func(t *testing.T) {
			const limit = 4 << 20
			c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
				cfg.Ephemeral = ephemeral
				cfg.Raft.MaxLogBytes = limit
			}))
			leader := c.WaitLeader(10 * time.Second)
			s := openSession(t, c.Client(leader.APIAddr()))
			want := map[string][]byte{}
			for i := range 48 {
				p := fmt.Sprintf("/f%d", i)
				s.create(p)
				want[p] = pattern(512<<10, byte(i))
				require.Zero(t, s.write(p, 0, want[p]).Errno)
			}
			for i := range 3 {
				n := c.Node(i)
				require.Eventually(t, func() bool { return n.HeldLog().Bytes() <= limit },
					20*time.Second, 20*time.Millisecond, "node %d holds %d bytes of log", i, n.HeldLog().Bytes())
				first, err := n.Stores().Log.FirstIndex()
				require.NoError(t, err)
				require.Greater(t, first, uint64(1), "node %d never truncated its log", i)
			}
			i := c.AddNode()
			n := c.Node(i)
			c.WaitApplied(leader.AppliedIndex(), 30*time.Second)
			cli := c.Client(n.APIAddr())
			for p, data := range want {
				require.Equal(t, data, readAll(t, cli, p, pb.Consistency_STALE), p)
			}
		})
	}
}
