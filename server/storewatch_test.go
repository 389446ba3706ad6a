package server

import (
	"bytes"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// The watch fires once, for the very slice registered: a follower's
// decoded copy with the same bytes is not the leader's entry.
func TestStoreWatchMatchesTheSameSliceOnce(t *testing.T) {
	w := newStoreWatch()
	data := []byte{entryFS, 1, 2, 3}
	calls := 0
	w.add(data, func() { calls++ })

	w.stored([]*raft.Log{{Data: bytes.Clone(data)}, {Data: nil}})
	require.Equal(t, 0, calls)
	w.stored([]*raft.Log{{Data: []byte{9}}, {Data: data}})
	require.Equal(t, 1, calls)
	w.stored([]*raft.Log{{Data: data}})
	require.Equal(t, 1, calls)

	w.add(data, func() { calls++ })
	w.remove(data)
	w.stored([]*raft.Log{{Data: data}})
	require.Equal(t, 1, calls)
}
