package fsm

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/memoryfs/memfs/memfspb"
)

// notInodeFields are the 64-bit unsigned fields of the messages a
// confined client sends and receives that carry no inode number.
var notInodeFields = map[protoreflect.FullName]bool{
	"memfs.v1.Attr.size": true, "memfs.v1.Attr.generation": true, "memfs.v1.Attr.blocks": true, "memfs.v1.Attr.rdev": true,
	"memfs.v1.Statfs.total_bytes": true, "memfs.v1.Statfs.free_bytes": true, "memfs.v1.Statfs.files": true,
	"memfs.v1.Statfs.logical_bytes": true, "memfs.v1.Statfs.physical_bytes": true, "memfs.v1.Statfs.block_count": true,
	"memfs.v1.WriteCmd.handle": true, "memfs.v1.WriteCmd.length": true, "memfs.v1.SetAttrCmd.handle": true,
	"memfs.v1.MknodCmd.rdev": true, "memfs.v1.CapRef.epoch": true, "memfs.v1.CloseCmd.handle": true,
	"memfs.v1.LockCmd.owner": true, "memfs.v1.LockCmd.start": true, "memfs.v1.LockCmd.end": true, "memfs.v1.LockCmd.cancel": true,
	"memfs.v1.Lock.start": true, "memfs.v1.Lock.end": true, "memfs.v1.Lock.session": true, "memfs.v1.Lock.owner": true,
	"memfs.v1.Command.session": true, "memfs.v1.Command.seq": true, "memfs.v1.Command.ack": true,
	"memfs.v1.Result.handle": true, "memfs.v1.Result.n": true, "memfs.v1.Result.session": true,
	"memfs.v1.Result.epoch": true, "memfs.v1.Result.waiter": true,
	"memfs.v1.ReadQuery.handle": true, "memfs.v1.HandleQuery.session": true, "memfs.v1.HandleQuery.handle": true,
	"memfs.v1.LockQuery.session": true, "memfs.v1.LockQuery.owner": true, "memfs.v1.LockQuery.start": true,
	"memfs.v1.LockQuery.end": true, "memfs.v1.LockQuery.waiter": true,
	"memfs.v1.TreeUsage.files": true, "memfs.v1.TreeUsage.logical_bytes": true,
	"memfs.v1.TreeUsage.physical_bytes": true, "memfs.v1.TreeUsage.shared_bytes": true,
	"memfs.v1.WatchEvent.index": true, "memfs.v1.Recall.session": true, "memfs.v1.Recall.epoch": true,
	"memfs.v1.HandoffCmd.epoch": true, "memfs.v1.HandoffCmd.to": true, "memfs.v1.HandoffCmd.changed": true,
	"memfs.v1.RegionQuery.first": true, "memfs.v1.RegionQuery.fetch": true, "memfs.v1.RegionQuery.holder": true,
	"memfs.v1.RegionQuery.epoch": true, "memfs.v1.RegionQuery.leecher": true,
	"memfs.v1.RegionState.size": true, "memfs.v1.RegionState.holder": true, "memfs.v1.RegionState.epoch": true,
	"memfs.v1.RegionState.leecher": true, "memfs.v1.RegionState.changed": true,
}

// TestInodeFieldsNamed: every 64-bit unsigned field reachable from a
// command, query, result or watch event is either swapped for a confined
// client (inodeFields) or known not to be an inode number, so that a new
// inode field cannot leak a real number unnoticed.
func TestInodeFieldsNamed(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			switch fd.Kind() {
			case protoreflect.MessageKind:
				walk(fd.Message())
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				require.True(t, inodeFields[fd.FullName()] != notInodeFields[fd.FullName()],
					"%s: name it in inodeFields (confine.go) or notInodeFields", fd.FullName())
			}
		}
	}
	for _, m := range []protoreflect.ProtoMessage{&pb.Command{}, &pb.Query{}, &pb.Result{}, &pb.WatchEvent{}} {
		walk(m.ProtoReflect().Descriptor())
	}
	for name := range inodeFields {
		md := name.Parent()
		require.True(t, seen[md], "%s: no such message reachable", name)
	}
}

// TestSwapInodesTwiceGivesBack: swapping is its own inverse, nested
// messages included.
func TestSwapInodesTwiceGivesBack(t *testing.T) {
	c := &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{
		Fences: []*pb.CapRef{{Ino: 1, Epoch: 1}, {Ino: 9, Epoch: 9}},
		Commands: []*pb.Command{
			{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{Src: &pb.Loc{Parent: 1, Name: "a"}, Dst: &pb.Loc{Ino: 9}}}},
			{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{1, 5, 9}}}},
		}}}}
	SwapInodes(c, 9)
	b := c.GetBatch()
	require.Equal(t, []uint64{9, 1}, []uint64{b.Fences[0].Ino, b.Fences[1].Ino})
	require.Equal(t, []uint64{1, 9}, []uint64{b.Fences[0].Epoch, b.Fences[1].Epoch}, "epochs are not inodes")
	require.EqualValues(t, 9, b.Commands[0].GetRename().Src.Parent)
	require.EqualValues(t, 1, b.Commands[0].GetRename().Dst.Ino)
	require.Equal(t, []uint64{9, 5, 1}, b.Commands[1].GetGrant().Inos)
	SwapInodes(c, 9)
	require.EqualValues(t, 1, b.Commands[0].GetRename().Src.Parent)
	require.Equal(t, []uint64{1, 5, 9}, b.Commands[1].GetGrant().Inos)
}
