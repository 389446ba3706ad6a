package server_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

const chunk = block.DefaultChunkSize

// uniqueBytes returns n bytes no other seed repeats (so no chunk dedups).
func uniqueBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	key[31] = 7
	r := rand.NewChaCha8(key)
	_, _ = r.Read(b)
	return b
}

// manualSnapshots makes snapshots happen only when a test asks, and keeps
// few log entries behind them, so a follower that misses a little needs
// the snapshot.
func manualSnapshots() servertest.ClusterOption {
	return servertest.WithNodeConfig(func(_ int, c *server.Config) {
		c.Raft.SnapshotThreshold = 1 << 30
		c.Raft.SnapshotInterval = time.Hour
		c.Raft.TrailingLogs = 8
	})
}

func snapshotNow(t testing.TB, n *server.Node) {
	t.Helper()
	require.NoError(t, n.Raft().Snapshot().Error(), "snapshot on %s", n.ID())
}

// writeChunks writes data at off in 1 MiB commands.
func writeChunks(s *session, path string, off int64, data []byte) {
	for len(data) > 0 {
		piece := data[:min(len(data), 1<<20)]
		r := s.write(path, off, piece)
		require.Zero(s.t, r.GetErrno(), r.GetMessage())
		off += int64(len(piece))
		data = data[len(piece):]
	}
}

// fileCluster starts three nodes that snapshot only when asked and writes
// chunks unique chunks (seed) to path through the leader.
func fileCluster(t *testing.T, path string, chunks int, seed uint64) (*servertest.Cluster, *server.Node, *session, []byte) {
	t.Helper()
	c := servertest.StartCluster(t, 3, manualSnapshots())
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.create(path)
	data := uniqueBytes(chunks*chunk, seed)
	writeChunks(s, path, 0, data)
	return c, leader, s, data
}

func TestSnapshotPersistsOnlyNewBlocks(t *testing.T) {
	_, leader, s, _ := fileCluster(t, "/big", 64, 1)
	snapshotNow(t, leader)
	dir := leader.BlockDir()
	first := dir.Stats().Written
	require.GreaterOrEqual(t, first, uint64(64*chunk), "the first snapshot writes every block")

	writeChunks(s, "/big", 10*chunk, uniqueBytes(chunk, 2))
	snapshotNow(t, leader)
	require.Equal(t, uint64(chunk), dir.Stats().Written-first, "the second snapshot writes only the changed block")
	metas, err := leader.Stores().Snapshots.List()
	require.NoError(t, err)
	require.Less(t, metas[0].Size, int64(chunk), "a snapshot names blocks, it does not hold them")

	// Overwrite everything; once two snapshots of the new data are kept,
	// the old blocks leave the disk.
	writeChunks(s, "/big", 0, uniqueBytes(64*chunk, 3))
	snapshotNow(t, leader)
	s.mkdir("/d") // a snapshot needs something new to snapshot
	snapshotNow(t, leader)
	require.Eventually(t, func() bool { return dir.Stats().Bytes == uint64(64*chunk) }, 10*time.Second, 20*time.Millisecond,
		"disk holds %d bytes", dir.Stats().Bytes)
}

// TestSnapshotBeingReadKeepsItsBlocks: a snapshot open for reading (Raft
// sending it to a follower) keeps the blocks it names on disk after newer
// snapshots have replaced it, until the reader is closed.
func TestSnapshotBeingReadKeepsItsBlocks(t *testing.T) {
	_, leader, s, _ := fileCluster(t, "/big", 16, 11)
	snapshotNow(t, leader)
	metas, err := leader.Stores().Snapshots.List()
	require.NoError(t, err)
	_, rc, err := leader.Stores().Snapshots.Open(metas[0].ID)
	require.NoError(t, err)

	writeChunks(s, "/big", 0, uniqueBytes(16*chunk, 12))
	snapshotNow(t, leader)
	s.mkdir("/d")
	snapshotNow(t, leader)
	metas, err = leader.Stores().Snapshots.List()
	require.NoError(t, err)
	require.Len(t, metas, 2, "the snapshot being read was reaped")
	dir := leader.BlockDir()
	collect := func() uint64 {
		_, err := dir.Retain(leader.LiveBlocks)
		require.NoError(t, err)
		return dir.Stats().Bytes
	}
	require.Equal(t, uint64(32*chunk), collect(), "the blocks of the snapshot being read were collected")

	require.NoError(t, rc.Close())
	require.Equal(t, uint64(16*chunk), collect(), "closed: its blocks go")
}

func TestDeltaCatchUpFetchesOnlyWhatChanged(t *testing.T) {
	c, leader, s, data := fileCluster(t, "/big", 64, 4)
	f := follower(c, leader, 0)
	lag := c.Index(f)
	c.WaitApplied(leader.AppliedIndex(), 10*time.Second)
	// Its last snapshot (nodes take them every SnapshotInterval) keeps its
	// blocks on its disk; a restarted Raft node applies nothing from its
	// log until it hears from a leader.
	snapshotNow(t, f)
	c.Stop(lag)

	// 5% of the data changes while the node is away, and enough entries
	// pass that the leader's log no longer reaches back to it.
	changed := uniqueBytes(3*chunk, 5)
	writeChunks(s, "/big", 20*chunk, changed)
	copy(data[20*chunk:], changed)
	for i := range 30 {
		s.mkdir("/d" + string(rune('a'+i)))
	}
	snapshotNow(t, leader)

	n := c.Restart(lag)
	c.WaitApplied(leader.AppliedIndex(), 30*time.Second)
	require.Equal(t, uint64(3*chunk), n.SyncFetchedBytesTotal(), "only the changed blocks cross the network")
	require.Equal(t, data, readAll(t, c.Client(n.APIAddr()), "/big", pb.Consistency_STALE))
	st := n.SelfStatus()
	require.Equal(t, uint64(3), st.SyncBlocksFetched)
	require.Equal(t, uint64(3*chunk), st.SyncBytesWanted)
	requireSnapshotsOnDisk(t, n)
}

// requireSnapshotsOnDisk checks that every block n's listed snapshots name
// is in its block directory, so it can restart without its peers.
func requireSnapshotsOnDisk(t *testing.T, n *server.Node) {
	t.Helper()
	metas, err := n.SnapshotStore().List()
	require.NoError(t, err)
	require.NotEmpty(t, metas)
	named, err := n.SnapshotStore().LiveBlocks()
	require.NoError(t, err)
	for h := range named {
		require.True(t, n.BlockDir().Has(h), "a snapshot names block %s, not on disk", h.Short())
	}
}

func TestCorruptBlockOnDiskIsRepairedFromPeer(t *testing.T) {
	c, leader, _, data := fileCluster(t, "/f", 8, 6)
	f := follower(c, leader, 0)
	c.WaitApplied(leader.AppliedIndex(), 10*time.Second)
	snapshotNow(t, f)
	i := c.Index(f)
	blocks := f.BlockDir().Path()
	c.Kill(i)

	packs, err := filepath.Glob(filepath.Join(blocks, "*.pack"))
	require.NoError(t, err)
	require.NotEmpty(t, packs)
	raw, err := os.ReadFile(packs[0])
	require.NoError(t, err)
	raw[100] ^= 0xff // inside the first block's data
	require.NoError(t, os.WriteFile(packs[0], raw, 0o600))

	n := c.Restart(i)
	st := n.SelfStatus()
	require.Equal(t, uint64(1), st.SyncCorruptBlocks)
	require.Equal(t, uint64(chunk), st.SyncBytesFetchedTotal, "the bad block came from a peer")
	require.Equal(t, data, readAll(t, c.Client(n.APIAddr()), "/f", pb.Consistency_STALE))
	for k := range 8 {
		h := block.Sum(data[k*chunk : (k+1)*chunk])
		_, err := n.BlockDir().Get(h)
		require.NoError(t, err, "block %d is whole on disk again", k)
	}
}

func TestWholeClusterRestartsFromIncrementalChain(t *testing.T) {
	c, leader, s, want := fileCluster(t, "/f", 16, 7)
	for _, n := range c.Nodes() {
		snapshotNow(t, n)
	}
	more := uniqueBytes(2*chunk, 8)
	writeChunks(s, "/f", 4*chunk, more)
	copy(want[4*chunk:], more)
	snapshotNow(t, leader)
	tail := uniqueBytes(chunk, 9) // only in the log
	writeChunks(s, "/f", 16*chunk, tail)
	want = append(want, tail...)
	c.WaitApplied(leader.AppliedIndex(), 10*time.Second)

	for i := range c.Size() {
		c.Kill(i)
	}
	for i := range c.Size() {
		c.Restart(i)
	}
	leader = c.WaitLeader(30 * time.Second)
	for _, n := range c.Nodes() {
		require.Zero(t, n.SyncFetchedBytesTotal(), "%s restored from its own disk", n.ID())
	}
	require.Equal(t, want, readAll(t, c.Client(leader.APIAddr()), "/f", pb.Consistency_LINEARIZABLE))
}

func TestFetchBlocksRefusesBadRequests(t *testing.T) {
	c := servertest.StartCluster(t, 1)
	cli := c.Client(c.Node(0).APIAddr())
	ctx := ctxTimeout(t, 10*time.Second)
	_, err := cli.MissingBlocks(ctx, &pb.MissingBlocksRequest{Version: pb.Version, Hashes: [][]byte{{1, 2, 3}}})
	require.ErrorContains(t, err, "hash 0")
	many := make([][]byte, pb.MaxSyncHashes+1)
	for i := range many {
		many[i] = make([]byte, block.HashSize)
	}
	_, err = cli.MissingBlocks(ctx, &pb.MissingBlocksRequest{Version: pb.Version, Hashes: many})
	require.ErrorContains(t, err, "at most")
	st, err := cli.FetchBlocks(ctx, &pb.FetchBlocksRequest{Version: 99})
	require.NoError(t, err)
	_, err = st.Recv()
	require.ErrorContains(t, err, "protocol version 99")
	unknown := block.Sum([]byte("nobody has this"))
	st, err = cli.FetchBlocks(ctx, &pb.FetchBlocksRequest{Version: pb.Version, Hashes: [][]byte{unknown[:]}})
	require.NoError(t, err)
	fr, err := st.Recv()
	require.NoError(t, err)
	require.True(t, fr.GetAbsent())
	resp, err := cli.MissingBlocks(context.Background(), &pb.MissingBlocksRequest{Version: pb.Version, Hashes: [][]byte{unknown[:]}})
	require.NoError(t, err)
	require.Equal(t, []uint32{0}, resp.GetMissing())
}

// lyingPeer claims to hold every block and sends each one corrupted.
type lyingPeer struct {
	pb.UnimplementedMemFSServer
	good pb.MemFSClient
}

func (p *lyingPeer) MissingBlocks(context.Context, *pb.MissingBlocksRequest) (*pb.MissingBlocksResponse, error) {
	return &pb.MissingBlocksResponse{}, nil
}

func (p *lyingPeer) FetchBlocks(req *pb.FetchBlocksRequest, stream grpc.ServerStreamingServer[pb.BlockFrame]) error {
	up, err := p.good.FetchBlocks(stream.Context(), req)
	if err != nil {
		return err
	}
	for {
		fr, err := up.Recv()
		if err != nil {
			return nil
		}
		if len(fr.Data) > 0 {
			fr.Data[0] ^= 1
		}
		if err := stream.Send(fr); err != nil {
			return err
		}
	}
}

func TestBlockCorruptInTransitIsFetchedElsewhere(t *testing.T) {
	c := servertest.StartCluster(t, 1)
	good := c.Node(0)
	s := openSession(t, c.Client(good.APIAddr()))
	s.create("/f")
	data := uniqueBytes(4*chunk, 10)
	writeChunks(s, "/f", 0, data)

	liar := servePeer(t, &lyingPeer{good: c.Client(good.APIAddr())})
	b, dir := server.NewTestSync(t, servertest.Logger(), time.Minute, 5*time.Second)
	// "a-liar" sorts first, so it is asked first for every block.
	src := b.Source(map[string]string{"a-liar": liar, "good": good.APIAddr(), "me": "x"})
	var want []fsm.BlockWant
	for i := range 4 {
		piece := data[i*chunk : (i+1)*chunk]
		want = append(want, fsm.BlockWant{Hash: block.Sum(piece), Size: chunk, Ino: 2, Index: uint64(i), FileSize: 4 * chunk})
	}
	got, err := src.Blocks(ctxTimeout(t, 30*time.Second), want)
	require.NoError(t, err)
	for i, w := range want {
		require.Equal(t, data[i*chunk:(i+1)*chunk], got[w.Hash].Bytes())
		onDisk, err := dir.Get(w.Hash)
		require.NoError(t, err, "only verified blocks are stored")
		require.Equal(t, got[w.Hash].Bytes(), onDisk)
	}
	require.Positive(t, b.CorruptTotal())
	require.Equal(t, uint64(4*chunk), b.GotBytes())
}

// servePeer serves impl as a peer's API on a loopback port.
func servePeer(t *testing.T, impl pb.MemFSServer) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterMemFSServer(srv, impl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// stallingPeer claims to hold every block and never sends one.
type stallingPeer struct {
	pb.UnimplementedMemFSServer
}

func (stallingPeer) MissingBlocks(context.Context, *pb.MissingBlocksRequest) (*pb.MissingBlocksResponse, error) {
	return &pb.MissingBlocksResponse{}, nil
}

func (stallingPeer) FetchBlocks(_ *pb.FetchBlocksRequest, stream grpc.ServerStreamingServer[pb.BlockFrame]) error {
	<-stream.Context().Done()
	return nil
}

// TestBlockNobodyDeliversIsLost: blocks only a lying and a stalling peer
// claim to hold are given up after the minimum rounds with EIO, the
// stalled stream abandoned each time, and nothing is stored.
func TestBlockNobodyDeliversIsLost(t *testing.T) {
	c := servertest.StartCluster(t, 1)
	good := c.Node(0)
	s := openSession(t, c.Client(good.APIAddr()))
	s.create("/f")
	data := uniqueBytes(2*chunk, 11)
	writeChunks(s, "/f", 0, data)
	liar, staller := servePeer(t, &lyingPeer{good: c.Client(good.APIAddr())}), servePeer(t, stallingPeer{})
	b, dir := server.NewTestSync(t, servertest.Logger(), 0, 200*time.Millisecond)
	src := b.Source(map[string]string{"liar": liar, "staller": staller})
	want := []fsm.BlockWant{{Hash: block.Sum(data[:chunk]), Size: chunk, Ino: 2, FileSize: 2 * chunk}}
	_, err := src.Blocks(ctxTimeout(t, 30*time.Second), want)
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "in 3 rounds")
	require.False(t, dir.Has(want[0].Hash), "a block nobody delivered intact is not stored")
	require.Equal(t, uint64(3), b.CorruptTotal(), "the liar's copy, once a round")
}

// TestBlockEveryPeerLacksFailsAtOnce: when every peer answers and none
// holds a block, the restore fails after the minimum rounds, without
// waiting out the give-up time meant for unreachable peers.
func TestBlockEveryPeerLacksFailsAtOnce(t *testing.T) {
	c := servertest.StartCluster(t, 1)
	b, _ := server.NewTestSync(t, servertest.Logger(), time.Hour, 5*time.Second)
	src := b.Source(map[string]string{"n0": c.Node(0).APIAddr()})
	want := []fsm.BlockWant{{Hash: block.Sum([]byte("held by nobody")), Size: 14, Ino: 2, FileSize: 14}}
	_, err := src.Blocks(ctxTimeout(t, time.Minute), want)
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "in 3 rounds")
}

func TestNewNodeCatchesUpWhileLeaderWrites(t *testing.T) {
	c := servertest.StartCluster(t, 3, manualSnapshots())
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/base")
	base := uniqueBytes(32*chunk, 11)
	writeChunks(s, "/base", 0, base)
	snapshotNow(t, leader)

	// A writer keeps appending 64 KiB pieces while the node joins.
	stop := make(chan struct{})
	done := make(chan []byte)
	ws := openSession(t, cli)
	ws.create("/live")
	go func() {
		var acked []byte
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				done <- acked
				return
			default:
			}
			piece := uniqueBytes(chunk, 1000+i)
			if r := ws.write("/live", int64(len(acked)), piece); r.GetErrno() == 0 {
				acked = append(acked, piece...)
			}
		}
	}()
	i := c.AddNode()
	n := c.Node(i)
	require.Eventually(t, func() bool { return n.AppliedIndex() >= leader.AppliedIndex()-1 }, 60*time.Second, 20*time.Millisecond)
	close(stop)
	acked := <-done
	c.WaitApplied(leader.AppliedIndex(), 30*time.Second)

	require.GreaterOrEqual(t, n.SyncFetchedBytesTotal(), uint64(32*chunk), "the new node got the base through block sync")
	requireSnapshotsOnDisk(t, n)
	ncli := c.Client(n.APIAddr())
	require.Equal(t, base, readAll(t, ncli, "/base", pb.Consistency_STALE))
	require.Equal(t, acked, readAll(t, ncli, "/live", pb.Consistency_STALE))
}
