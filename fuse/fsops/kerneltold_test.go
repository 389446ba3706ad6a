package fsops

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKernelToldContended: an inode recalled lately is answered with no
// validity, so that its next recall has nothing to tell the kernel; one
// the kernel may still answer about is reported by its recall.
func TestKernelToldContended(t *testing.T) {
	var k kernelTold
	require.Zero(t, k.tell(1, 0), "no capability, no validity")
	_, holds := k.recall(1)
	require.False(t, holds, "the kernel was told nothing it may keep")

	require.Equal(t, time.Second, k.tell(2, time.Second))
	at, holds := k.recall(2)
	require.True(t, holds, "the kernel may answer from that reply")
	require.WithinDuration(t, time.Now(), at, time.Second)
	require.Zero(t, k.tell(2, time.Second), "recalled lately: contended")
	_, holds = k.recall(2)
	require.False(t, holds)

	k.mu.Lock()
	k.recalled[2] = time.Now().Add(-contendedFor)
	k.mu.Unlock()
	require.Equal(t, time.Second, k.tell(2, time.Second), "calm again")
}

// TestKernelToldSweeps: the maps hold about what still matters.
func TestKernelToldSweeps(t *testing.T) {
	var k kernelTold
	for ino := range uint64(5000) {
		k.tell(ino, time.Nanosecond)
	}
	k.tell(99999, time.Second)
	k.mu.Lock()
	defer k.mu.Unlock()
	require.Less(t, len(k.valid), 5000)
}
