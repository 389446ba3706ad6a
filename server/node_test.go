package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func TestWriteOnOneNodeReadOnAnother(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	f1, f2 := follower(c, leader, 0), follower(c, leader, 1)

	// Commands sent to a follower are forwarded to the leader.
	s := openSession(t, c.Client(f1.APIAddr()))
	s.mkdir("/d")
	s.create("/d/small")
	small := pattern(100<<10, 1)
	res := s.write("/d/small", 0, small)
	require.EqualValues(t, len(small), res.N)

	s.create("/d/big")
	big := pattern(5<<20+123, 2) // several frames each way
	s.streamWrite("/d/big", big, pb.MaxMessageData)

	// A linearizable read on the other follower sees the writes at once.
	other := c.Client(f2.APIAddr())
	st := stat(t, other, "/d/small", pb.Consistency_LINEARIZABLE)
	require.Zero(t, st.Errno, st.Message)
	require.EqualValues(t, len(small), st.Attr.Size)
	rd := query(t, other, &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: "/d/small"}, Length: 1 << 30}}},
		pb.Consistency_LINEARIZABLE)
	require.Zero(t, rd.Errno, rd.Message)
	require.Equal(t, small, rd.Data)
	require.Equal(t, big, readAll(t, other, "/d/big", pb.Consistency_LINEARIZABLE))

	// A unary read is capped at one message; the rest needs the stream.
	rd = query(t, other, &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: "/d/big"}, Length: 1 << 30}}},
		pb.Consistency_LINEARIZABLE)
	require.Equal(t, big[:pb.MaxMessageData], rd.Data)
	require.False(t, rd.Eof)

	// A stale read is served locally once the follower has caught up.
	c.WaitApplied(leader.AppliedIndex(), 10*time.Second)
	require.Equal(t, big, readAll(t, other, "/d/big", pb.Consistency_STALE))
	require.Equal(t, big, readAll(t, c.Client(leader.APIAddr()), "/d/big", pb.Consistency_STALE))
}

func TestConcurrentCommandsGetTheirOwnResults(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(follower(c, leader, 0).APIAddr())
	first := leader.Raft().LastIndex()
	const workers, each = 16, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			s := openSession(t, cli)
			for i := range each {
				s.mkdir(fmt.Sprintf("/w%d-%d", w, i))
			}
			// A second mkdir of the same name fails for this caller only.
			res := s.apply(&pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: fmt.Sprintf("/w%d-0", w)}}}})
			require.Equal(t, syscall.EEXIST, errnoOf(res))
		})
	}
	wg.Wait()
	entries := leader.Raft().LastIndex() - first
	t.Logf("%d commands in %d log entries", workers*(each+2), entries)
	st := stat(t, cli, "/", pb.Consistency_LINEARIZABLE)
	require.EqualValues(t, 2+workers*each, st.Attr.Nlink, "root links: . and .. plus one per subdirectory")
}

func TestLeaderFailoverKeepsWriting(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(follower(c, leader, 0).APIAddr()))
	s.create("/f")
	var acked [][]byte
	write := func(i int) {
		data := pattern(4096, byte(i))
		s.write("/f", int64(i)*4096, data)
		acked = append(acked, data)
	}
	for i := range 20 {
		write(i)
	}
	// Keep the client on a node that survives: it forwards to whoever leads.
	survivor := follower(c, leader, 0)
	s.cli = c.Client(survivor.APIAddr())
	killed := time.Now()
	c.Kill(c.Index(leader))
	write(20)
	t.Logf("writes resumed %v after killing the leader", time.Since(killed).Round(time.Millisecond))
	for i := 21; i < 40; i++ {
		write(i)
	}
	newLeader := c.WaitLeader(10 * time.Second)
	require.NotEqual(t, leader.ID(), newLeader.ID())
	got := readAll(t, s.cli, "/f", pb.Consistency_LINEARIZABLE)
	require.Len(t, got, len(acked)*4096)
	for i, d := range acked {
		require.Equal(t, d, got[i*4096:(i+1)*4096], "block %d", i)
	}
}

func TestRestartEveryNodeFromItsDataDir(t *testing.T) {
	for _, store := range []string{server.LogStoreBolt, server.LogStoreWAL} {
		t.Run(store, func(t *testing.T) {
			c := servertest.StartCluster(t, 3, servertest.WithLogStore(store))
			leader := c.WaitLeader(10 * time.Second)
			s := openSession(t, c.Client(leader.APIAddr()))
			want := map[string][]byte{}
			for i := range 30 {
				p := fmt.Sprintf("/file%d", i)
				s.create(p)
				want[p] = pattern(1000+i*997, byte(i))
				s.write(p, 0, want[p])
			}
			for i := range c.Size() {
				c.Kill(i) // crash: no snapshot, no transfer
			}
			for i := range c.Size() {
				c.Restart(i)
			}
			leader = c.WaitLeader(20 * time.Second)
			cli := c.Client(leader.APIAddr())
			for p, data := range want {
				require.Equal(t, data, readAll(t, cli, p, pb.Consistency_LINEARIZABLE), p)
			}
			// The restarted cluster takes new writes too.
			s = openSession(t, cli)
			s.create("/after")
		})
	}
}

func TestGracefulStopHandsOverLeadership(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(follower(c, leader, 0).APIAddr()))
	s.mkdir("/before")
	c.Stop(c.Index(leader))
	next := c.WaitLeader(10 * time.Second)
	require.NotEqual(t, leader.ID(), next.ID())
	s.mkdir("/after")
	require.Zero(t, stat(t, s.cli, "/before", pb.Consistency_LINEARIZABLE).Errno)
}

func TestJoinAfterSnapshotCatchesUp(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Raft.SnapshotThreshold = 16
		cfg.Raft.TrailingLogs = 4
		cfg.Raft.SnapshotInterval = 50 * time.Millisecond
	}))
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(leader.APIAddr()))
	want := map[string][]byte{}
	for i := range 60 {
		p := fmt.Sprintf("/f%d", i)
		s.create(p)
		want[p] = pattern(3000+i, byte(i))
		s.write(p, 0, want[p])
	}
	// The leader snapshots and truncates its log behind the snapshot.
	require.Eventually(t, func() bool {
		first, err := leader.Stores().Log.FirstIndex()
		snaps, lerr := leader.Stores().Snapshots.List()
		return err == nil && lerr == nil && len(snaps) > 0 && first > 1
	}, 20*time.Second, 20*time.Millisecond, "log never truncated")
	first, _ := leader.Stores().Log.FirstIndex()
	last, _ := leader.Stores().Log.LastIndex()
	t.Logf("leader log holds entries %d..%d", first, last)

	// A new node must be sent the snapshot: the log no longer starts at 1.
	i := c.AddNode()
	n := c.Node(i)
	c.WaitApplied(leader.AppliedIndex(), 20*time.Second)
	cli := c.Client(n.APIAddr())
	for p, data := range want {
		require.Equal(t, data, readAll(t, cli, p, pb.Consistency_STALE), p)
	}
	require.Equal(t, leader.FSM().Stats().Inodes, n.FSM().Stats().Inodes)
	// The member map came with the snapshot.
	require.Equal(t, leader.Members()[leader.ID()], n.Members()[leader.ID()])
	st, err := cli.Status(ctxTimeout(t, 10*time.Second), &pb.StatusRequest{Version: pb.Version})
	require.NoError(t, err)
	require.Len(t, st.Nodes, 4)

	// And a node restarted from its own snapshot comes back whole.
	c.Kill(0)
	c.Restart(0)
	c.WaitLeader(10 * time.Second)
	c.WaitApplied(c.WaitLeader(10*time.Second).AppliedIndex(), 20*time.Second)
	for p, data := range want {
		require.Equal(t, data, readAll(t, c.Client(c.Node(0).APIAddr()), p, pb.Consistency_STALE), p)
	}
}

func TestRemoveNode(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	i := c.AddNode()
	removed := c.Node(i)
	cli := c.Client(follower(c, leader, 0).APIAddr())
	ctx := ctxTimeout(t, 20*time.Second)
	_, err := cli.RemoveNode(ctx, &pb.RemoveNodeRequest{Version: pb.Version, Id: removed.ID()})
	require.NoError(t, err)
	st, err := cli.Status(ctx, &pb.StatusRequest{Version: pb.Version})
	require.NoError(t, err)
	require.Len(t, st.Nodes, 3)
	for _, ns := range st.Nodes {
		require.NotEqual(t, removed.ID(), ns.Id)
	}
	_, err = cli.RemoveNode(ctx, &pb.RemoveNodeRequest{Version: pb.Version, Id: "nobody"})
	require.Error(t, err)
	c.Kill(i)
	openSession(t, cli).mkdir("/still-writable")
}

func TestFollowerNamesLeaderWhenItCannotForward(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	f := follower(c, leader, 0)
	// A forwarded request is never forwarded again: the follower answers
	// UNAVAILABLE and names the leader.
	ctx := metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), server.ForwardedKey, "1")
	var tr metadata.MD
	_, err := c.Client(f.APIAddr()).Apply(ctx, &pb.ApplyRequest{Version: pb.Version,
		Command: &pb.Command{Op: &pb.Command_Tick{Tick: &pb.TickCmd{}}}}, grpcTrailer(&tr))
	requireCode(t, err, "Unavailable")
	require.Equal(t, []string{leader.APIAddr()}, tr.Get(pb.LeaderTrailer))
}

func TestForwardedAnswerNamesLeader(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(follower(c, leader, 0).APIAddr())
	s := openSession(t, cli)
	s.create("/f")
	stat := &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/f"}}}}
	read := &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: "/f"}, Length: 10}}}
	// Each call a follower forwards and the leader answers names the
	// leader in its trailer, so a client moves its next calls there.
	cases := []struct {
		name string
		call func(ctx context.Context) (metadata.MD, error)
	}{
		{"Apply", func(ctx context.Context) (metadata.MD, error) {
			s.seq++
			cmd := server.WriteCmd("/f", 0, []byte("apply"))
			cmd.Session, cmd.Seq = s.id, s.seq
			var tr metadata.MD
			_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: cmd}, grpcTrailer(&tr))
			return tr, err
		}},
		{"Query", func(ctx context.Context) (metadata.MD, error) {
			var tr metadata.MD
			_, err := cli.Query(ctx, &pb.QueryRequest{Version: pb.Version, Query: stat}, grpcTrailer(&tr))
			return tr, err
		}},
		{"Write", func(ctx context.Context) (metadata.MD, error) {
			s.seq++
			cmd := server.WriteCmd("/f", 0, nil)
			cmd.Session, cmd.Seq = s.id, s.seq
			cmd.GetWrite().Length = 6
			st, err := cli.Write(ctx)
			if err != nil {
				return nil, err
			}
			if err := st.Send(&pb.WriteFrame{Version: pb.Version, Command: cmd, Data: []byte("stream")}); err != nil {
				return nil, err
			}
			_, err = st.CloseAndRecv()
			return st.Trailer(), err
		}},
		{"Read", func(ctx context.Context) (metadata.MD, error) {
			st, err := cli.Read(ctx, &pb.QueryRequest{Version: pb.Version, Query: read})
			if err != nil {
				return nil, err
			}
			for {
				if _, err := st.Recv(); err != nil {
					if errors.Is(err, io.EOF) {
						err = nil
					}
					return st.Trailer(), err
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := tc.call(ctxTimeout(t, 10*time.Second))
			require.NoError(t, err)
			require.Equal(t, []string{leader.APIAddr()}, tr.Get(pb.LeaderTrailer))
		})
	}
	// The leader answers its own calls without naming anyone.
	var tr metadata.MD
	_, err := c.Client(leader.APIAddr()).Query(ctxTimeout(t, 10*time.Second),
		&pb.QueryRequest{Version: pb.Version, Query: stat}, grpcTrailer(&tr))
	require.NoError(t, err)
	require.Empty(t, tr.Get(pb.LeaderTrailer))
}

func TestHandleQueryWaitsForExclusiveOpen(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(follower(c, leader, 0).APIAddr())
	a, b := openSession(t, cli), openSession(t, cli)
	a.create("/lock")
	open := func(s *session, wait bool) *pb.Result {
		return s.apply(&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
			Loc: &pb.Loc{Path: "/lock"}, Flags: oWronly, Exclusive: true, Wait: wait}}})
	}
	ha := open(a, false)
	require.Zero(t, ha.Errno, ha.Message)
	hb := open(b, true)
	require.Zero(t, hb.Errno, hb.Message)
	require.True(t, hb.Queued)

	done := make(chan *pb.Result, 1)
	go func() {
		done <- query(t, cli, &pb.Query{Q: &pb.Query_Handle{Handle: &pb.HandleQuery{
			Session: b.id, Handle: hb.Handle, Wait: true}}}, pb.Consistency_LINEARIZABLE)
	}()
	res := a.apply(&pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: ha.Handle}}})
	require.Zero(t, res.Errno, res.Message)
	select {
	case r := <-done:
		require.Zero(t, r.Errno, r.Message)
		require.False(t, r.Queued, "granted once the holder closed")
	case <-time.After(20 * time.Second):
		t.Fatal("long poll did not return after the handle was granted")
	}
}

func TestWatchStreamsChanges(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	f := follower(c, leader, 0)
	ctx := ctxTimeout(t, 20*time.Second)
	w, err := c.Client(f.APIAddr()).Watch(ctx, &pb.WatchRequest{Version: pb.Version})
	require.NoError(t, err)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.mkdir("/watched")
	for {
		ev, err := w.Recv()
		require.NoError(t, err)
		for _, e := range ev.Entries {
			if e.Name == "watched" {
				return
			}
		}
	}
}

func TestUnixSocketServesTheAPI(t *testing.T) {
	sock := t.TempDir() + "/n.sock"
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) { cfg.UnixSocket = sock }))
	c.WaitLeader(10 * time.Second)
	cli := c.Client("unix://" + sock)
	s := openSession(t, cli)
	s.mkdir("/via-unix")
	require.Zero(t, stat(t, cli, "/via-unix", pb.Consistency_LINEARIZABLE).Errno)
}

func TestEphemeralClusterServes(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.mkdir("/mem")
	// An ephemeral node restarts empty and rejoins; the others fill it in.
	f := c.Index(follower(c, leader, 0))
	c.Kill(f)
	n := c.Restart(f)
	c.WaitApplied(leader.AppliedIndex(), 20*time.Second)
	require.Zero(t, stat(t, c.Client(n.APIAddr()), "/mem", pb.Consistency_STALE).Errno)
}

func TestLeaseTicksAdvanceLogTime(t *testing.T) {
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.TickInterval = 20 * time.Millisecond
	}))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := &session{t: t, cli: cli}
	res := s.apply(&pb.Command{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 200}}})
	require.Zero(t, res.Errno, res.Message)
	// Nobody writes; ticks alone must expire the lease.
	require.Eventually(t, func() bool { return leader.FSM().Stats().Sessions == 0 },
		20*time.Second, 20*time.Millisecond)
	s.id, s.seq = res.Session, 0
	res = s.apply(&pb.Command{Op: &pb.Command_KeepAlive{KeepAlive: &pb.KeepAliveCmd{}}})
	require.Equal(t, syscall.ESTALE, errnoOf(res))
}

func TestLeaderStampsItsClock(t *testing.T) {
	stamp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Clock = func() time.Time { return stamp }
	}))
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.mkdir("/stamped")
	st := stat(t, s.cli, "/stamped", pb.Consistency_LINEARIZABLE)
	require.Zero(t, st.Errno)
	require.InDelta(t, stamp.UnixNano(), st.Attr.MtimeNs, float64(time.Second))
}

func TestRestartOnNewAPIAddressUpdatesTheMap(t *testing.T) {
	moved := -1
	c := servertest.StartCluster(t, 3, servertest.WithRestartConfig(func(i int, cfg *server.Config) {
		if i == moved {
			cfg.APIAddr = "127.0.0.1:0" // comes back on another port
		}
	}))
	leader := c.WaitLeader(10 * time.Second)
	i := c.Index(follower(c, leader, 0))
	old := c.Node(i).APIAddr()
	c.Kill(i)
	moved = i
	n := c.Restart(i)
	require.NotEqual(t, old, n.APIAddr())
	require.Eventually(t, func() bool {
		l := c.Leader()
		return l != nil && l.Members()[n.ID()] == n.APIAddr()
	}, 20*time.Second, 20*time.Millisecond)
	// Once the new leader knows it, forwarding through the moved node works.
	openSession(t, c.Client(n.APIAddr())).mkdir("/moved")
}
