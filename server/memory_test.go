package server_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestProcessLimitLeavesBlocksTheRest runs a one-node cluster with a
// whole-process limit 384 MiB above what the test process already holds
// (the governor measures the whole process, which holds what earlier
// tests of the package left, and more under the race detector). The
// budget it stamps is the limit less what the process needs besides
// blocks, every replica enforces it, writes past it get ENOSPC, and the
// process's anonymous memory stays under the limit.
// The node is ephemeral, so its Raft log is on the heap too and counts
// against the limit like any other memory.
func TestProcessLimitLeavesBlocksTheRest(t *testing.T) {
	limit := uint64(384 << 20)
	if m := server.ReadProcessMemory(); m.Anon > 0 {
		limit += m.Anon
	}
	c := servertest.StartCluster(t, 1, servertest.WithEphemeral(), servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.ProcessMemoryLimit = limit
	}))
	n := c.WaitLeader(10 * time.Second)
	require.True(t, n.HasMemoryGovernor())
	s := openSession(t, c.Client(n.APIAddr()))
	stored, refused := 0, 0
	for i := 0; refused < 3 && i < 1000; i++ {
		path := fmt.Sprintf("/f%d", i)
		s.create(path)
		switch errnoOf(s.apply(server.WriteCmd(path, 0, server.RandomBytes(1<<20, byte(i), byte(i>>8))))) {
		case 0:
			stored++
			refused = 0
		case syscall.ENOSPC:
			refused++
		default:
			t.Fatalf("write %d: neither done nor ENOSPC", i)
		}
	}
	require.Equal(t, 3, refused, "1000 MiB cannot fit a %d MiB process", limit>>20)
	st := n.FSM().Stats().Block
	require.Positive(t, stored)
	// The budget may have dropped below what is stored since (the process
	// needs more for itself later); what is stored stays.
	require.Less(t, st.Limit, limit-server.GovernorMargin, "the budget leaves the process its own memory")
	m := server.ReadProcessMemory()
	require.GreaterOrEqual(t, m.Blocks, st.PhysicalBytes, "blocks are resident in the arena")
	if m.Anon > 0 { // Linux
		require.Less(t, m.Anon, limit)
	}
	t.Logf("stored %d MiB; budget %d MiB; anonymous %d MiB of which blocks %d", stored, st.Limit>>20, m.Anon>>20, m.Blocks>>20)
}
