package server

import (
	"testing"

	"github.com/hashicorp/raft"
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
