package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/stretchr/testify/require"
)

func logsOf(sizes map[uint64]int, idx ...uint64) []*raft.Log {
	var out []*raft.Log
	for _, i := range idx {
		out = append(out, &raft.Log{Index: i, Data: make([]byte, sizes[i])})
	}
	return out
}

func TestHeldLogCountsWhatTheStoreHolds(t *testing.T) {
	sizes := map[uint64]int{1: 10, 2: 20, 3: 30, 4: 40, 5: 50}
	cases := []struct {
		name     string
		do       func(h *heldLog)
		want     uint64
		tail     uint64 // tailFitting(75)
		signaled bool
	}{
		{"stored", func(h *heldLog) { h.stored(logsOf(sizes, 1, 2, 3, 4, 5)) }, 150, 1, true},
		{"compacted prefix", func(h *heldLog) {
			h.stored(logsOf(sizes, 1, 2, 3, 4, 5))
			h.deleted(1, 3)
		}, 90, 1, true},
		{"prefix from before the first counted", func(h *heldLog) {
			h.stored(logsOf(sizes, 3, 4, 5))
			h.deleted(1, 4)
		}, 50, 1, true},
		{"conflicting suffix deleted", func(h *heldLog) {
			h.stored(logsOf(sizes, 1, 2, 3, 4, 5))
			h.deleted(4, 5)
		}, 60, 3, true},
		{"conflicting suffix overwritten", func(h *heldLog) {
			h.stored(logsOf(sizes, 1, 2, 3, 4, 5))
			h.stored(logsOf(map[uint64]int{3: 1, 4: 1}, 3, 4))
		}, 32, 4, true}, // signalled by the first store
		{"everything", func(h *heldLog) {
			h.stored(logsOf(sizes, 1, 2, 3, 4, 5))
			h.deleted(1, 5)
		}, 0, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHeldLog(100)
			tc.do(h)
			require.Equal(t, tc.want, h.Bytes())
			require.Equal(t, tc.tail, h.tailFitting(75))
			select {
			case <-h.over:
				require.True(t, tc.signaled, "signalled below the limit")
			default:
				require.False(t, tc.signaled, "not signalled past the limit")
			}
		})
	}
}

// Writes many times the log's byte bound: every node's log must stay near
// the bound (entries alone would keep 2048 of them), and a node added
// afterwards gets the snapshot that replaced them and reads every file.
func TestLogBoundedInBytes(t *testing.T) {
	for _, ephemeral := range []bool{true, false} {
		t.Run(fmt.Sprintf("ephemeral=%v", ephemeral), func(t *testing.T) {
			const limit = 4 << 20
			c := StartCluster(t, 3, WithNodeConfig(func(_ int, cfg *Config) {
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
				require.Eventually(t, func() bool { return n.held.Bytes() <= limit },
					20*time.Second, 20*time.Millisecond, "node %d holds %d bytes of log", i, n.held.Bytes())
				first, err := n.stores.Log.FirstIndex()
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
