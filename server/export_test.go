package server

// Unexported things of the package that its external tests (package
// server_test, which can use servertest) reach, and helpers both kinds of
// test share. Only tests compile this file.

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/blockdir"
)

// Helpers shared by the internal and the external tests.
var (
	CPUTime     = cpuTime
	RandomBytes = randomBytes
	WriteCmd    = writeCmd
)

// cpuTime is the process's user and system CPU time (every node and the
// clients: they share the process).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func randomBytes(n int, seed ...byte) []byte {
	var key [32]byte
	key[copy(key[:], seed)] = 6
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

func writeCmd(path string, off int64, data []byte) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Path: path}, Offset: off, Data: data}}}
}

const (
	ForwardedKey   = forwardedKey
	GovernorMargin = governorMargin
)

var WaitFuture = waitFuture

// The node's parts.
func (n *Node) Stores() *openedStores   { return n.stores }
func (n *Node) HeldLog() *heldLog       { return n.held }
func (n *Node) HasMemoryGovernor() bool { return n.memory != nil }
func (n *Node) SelfStatus() *pb.NodeStatus {
	return n.selfStatus()
}
func (n *Node) Suffrage(id string) (voter, ok bool) { return n.suffrage(id) }
func (n *Node) MemberMap() map[string]string        { return n.rfsm.memberMap() }

// DeleteMember appends the metadata entry that drops id from the member
// map (the first step of a removal) and waits for it to commit.
func (n *Node) DeleteMember(ctx context.Context, id string) error {
	return waitFuture(ctx, n.raft.Apply(encodeMeta(metaOp{Op: "del", ID: id}), 0))
}

// Block sync.
func (n *Node) BlockDir() *blockdir.Dir { return n.sync.dir }
func (n *Node) LiveBlocks() (func(block.Hash) bool, error) {
	return n.rfsm.liveBlocks()
}
func (n *Node) SnapshotStore() *blockSnapshots { return n.rfsm.snaps }
func (s *blockSnapshots) LiveBlocks() (map[block.Hash]struct{}, error) {
	return s.liveBlocks()
}
func (n *Node) SyncFetchedBytesTotal() uint64 { return n.sync.fetchedBytesTotal.Load() }
func (n *Node) SyncRestoring() bool           { return n.sync.restoring.Load() }
func (n *Node) SyncGotBytes() uint64          { return n.sync.gotBytes.Load() }
func (n *Node) SyncWantBytes() uint64         { return n.sync.wantBytes.Load() }

// TestSync is the block sync of an empty node with a block directory.
type TestSync struct{ b *blockSync }

func NewTestSync(t *testing.T, log *slog.Logger, giveUp, idle time.Duration) (*TestSync, *blockdir.Dir) {
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	dir, err := blockdir.Open(t.TempDir())
	require.NoError(t, err)
	ps := newPeers(nil, nil)
	t.Cleanup(ps.close)
	return &TestSync{&blockSync{id: "me", fsm: f, dir: dir, peers: ps, priority: SmallFilesFirst, log: log,
		giveUp: giveUp, idle: idle}}, dir
}

// Source is the block source of the sync, asking the peers of the map
// id -> API address.
func (s *TestSync) Source(addrs map[string]string) fsm.BlockSource { return s.b.source(addrs) }
func (s *TestSync) CorruptTotal() uint64                           { return s.b.corruptTotal.Load() }
func (s *TestSync) GotBytes() uint64                               { return s.b.gotBytes.Load() }

// Reads.
func (n *Node) LeaseRemaining() (time.Duration, bool) {
	return n.lease.remaining(n.raft.CurrentTerm(), raft.ServerID(n.ID()))
}
func (n *Node) LeaseRemainingIn(term uint64) (time.Duration, bool) {
	return n.lease.remaining(term, raft.ServerID(n.ID()))
}
func (n *Node) LeaseServed() uint64  { return n.lease.served.Load() }
func (n *Node) VerifyRounds() uint64 { return n.verifier.roundsRun.Load() }

// The vote gate.
func (n *Node) VoteGated() bool      { return n.gate.gated }
func (n *Node) VoteGateOpen() bool   { return n.gate.open.Load() }
func (n *Node) VoteFloorKnown() bool { return n.gate.floor.Load() != nil }

// HoldVoteGates keeps every closed vote gate of the process closed until
// the test ends, as if its node could not catch up.
func HoldVoteGates(t testing.TB) {
	holdVoteGate.Store(true)
	t.Cleanup(func() { holdVoteGate.Store(false) })
}
