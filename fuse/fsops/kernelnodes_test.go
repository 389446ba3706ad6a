package fsops

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// invalidated records InvalidateData calls.
type invalidated struct{ inos []uint64 }

func (i *invalidated) InvalidateAttr(uint64)          {}
func (i *invalidated) InvalidateData(ino uint64)      { i.inos = append(i.inos, ino) }
func (i *invalidated) InvalidateEntry(uint64, string) {}

// TestKernelNodes checks the lookup counting both bindings rely on: an
// inode stays until the kernel forgot every lookup of it.
func TestKernelNodes(t *testing.T) {
	var k KernelNodes
	k.Add(2)
	k.Add(2)
	k.Add(3)
	k.Add(4)
	k.Forget(2, 1) // one of two lookups left
	k.Forget(3, 1)
	k.Forget(4, ForgetAll)
	k.Forget(9, 1) // never looked up
	var inv invalidated
	k.InvalidateAll(&inv)
	require.Equal(t, []uint64{RootIno, 2}, inv.inos)
	k.Forget(2, 1)
	inv.inos = nil
	k.InvalidateAll(&inv)
	require.Equal(t, []uint64{RootIno}, inv.inos, "the root is always held")
	inv.inos = nil
	k.Add(5)
	k.Add(6)
	k.InvalidateAll(&inv)
	slices.Sort(inv.inos)
	require.Equal(t, []uint64{RootIno, 5, 6}, inv.inos)
}
