package server_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestReadWaitsForExclusiveCapability: a linearizable read by one client
// of a directory another session holds exclusively first recalls the
// capability (the holder sees a Recall on its change stream) and is
// answered only once the holder has released it, so it sees what the
// holder buffered and sent meanwhile; a holder that never answers delays
// it until its session's lease runs out. A reader whose session the
// cluster does not know is answered all the same.
func TestReadWaitsForExclusiveCapability(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, cfg *server.Config) { cfg.TickInterval = 50 * time.Millisecond }))
	leader := c.WaitLeader(10 * time.Second)
	f := follower(c, leader, 0)
	ctx := ctxTimeout(t, 60*time.Second)
	w, err := c.Client(leader.APIAddr()).Watch(ctx, &pb.WatchRequest{Version: pb.Version})
	require.NoError(t, err)
	recalls := make(chan *pb.Recall, 16)
	go func() {
		for {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			for _, r := range ev.Recalls {
				recalls <- r
			}
		}
	}()

	a := openSession(t, c.Client(f.APIAddr()))
	b := openSession(t, c.Client(leader.APIAddr()))
	a.mkdir("/d")
	d := stat(t, c.Client(f.APIAddr()), "/d", pb.Consistency_LINEARIZABLE).Attr.Ino
	g := a.apply(&pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{d}, Exclusive: true}}})
	require.Equal(t, []uint64{d}, g.Granted)
	r := a.apply(&pb.Command{Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: 4}}})
	require.Zero(t, r.Errno, r.Message)

	// B looks for a file A has "created" but not sent yet.
	got := asyncStat(ctx, c.Client(f.APIAddr()), b.id, "/d/new")
	select {
	case rc := <-recalls:
		require.Equal(t, &pb.Recall{Session: a.id, Ino: d, Epoch: g.Epoch}, cleanRecall(rc))
	case <-time.After(20 * time.Second):
		t.Fatal("no recall of the exclusive capability")
	}
	select {
	case res := <-got:
		t.Fatalf("the read was answered before the holder released: %v", res)
	case <-time.After(300 * time.Millisecond):
	}
	// The holder sends what it buffered, then releases.
	mk := &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/d/new"}, Mode: 0o755, Ino: r.FirstIno}}}
	bt := a.apply(&pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{
		Fences: []*pb.CapRef{{Ino: d, Epoch: g.Epoch}}, Commands: []*pb.Command{mk}}}})
	require.Zero(t, bt.Errno, bt.Message)
	a.apply(&pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: []*pb.CapRef{{Ino: d, Epoch: g.Epoch}}}}})
	// The read now leads to the new directory, which A holds exclusively
	// since it made it in a directory it held so: recalled in turn.
	created := bt.Results[0]
	select {
	case rc := <-recalls:
		require.Equal(t, &pb.Recall{Session: a.id, Ino: r.FirstIno, Epoch: created.Epoch}, cleanRecall(rc))
	case <-time.After(20 * time.Second):
		t.Fatal("no recall of the new directory's capability")
	}
	a.apply(&pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: []*pb.CapRef{{Ino: r.FirstIno, Epoch: created.Epoch}}}}})
	select {
	case res := <-got:
		require.Zero(t, res.GetErrno(), res.GetMessage())
		require.Equal(t, r.FirstIno, res.Attr.Ino, "the read sees what the holder sent")
	case <-time.After(20 * time.Second):
		t.Fatal("the read was not answered after the release")
	}

	// A holder that never answers: its session expires and takes the
	// capability with it. The reader names a session the cluster does
	// not know.
	h := &session{t: t, cli: c.Client(leader.APIAddr())}
	res := h.apply(&pb.Command{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 1500}}})
	h.id = res.Session
	g = h.apply(&pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{d}, Exclusive: true}}})
	require.Equal(t, []uint64{d}, g.Granted)
	start := time.Now()
	got = asyncStat(ctx, c.Client(f.APIAddr()), 1<<40, "/d")
	select {
	case res := <-got:
		require.Zero(t, res.GetErrno(), res.GetMessage())
		require.GreaterOrEqual(t, time.Since(start), time.Second, "answered while the holder's lease ran")
	case <-time.After(20 * time.Second):
		t.Fatal("the read was not answered after the holder's lease ran out")
	}
}

// asyncStat stats p linearizably as session s and sends the result.
func asyncStat(ctx context.Context, cli pb.MemFSClient, s uint64, p string) <-chan *pb.Result {
	out := make(chan *pb.Result, 1)
	go func() {
		resp, err := cli.Query(ctx, &pb.QueryRequest{Version: pb.Version, Session: s,
			Query: &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: p}}}}})
		if err != nil {
			out <- &pb.Result{Errno: 5, Message: err.Error()}
			return
		}
		out <- resp.Result
	}()
	return out
}

func cleanRecall(r *pb.Recall) *pb.Recall {
	return &pb.Recall{Session: r.Session, Ino: r.Ino, Epoch: r.Epoch, Revoked: r.Revoked}
}

// TestCommandWaitsForExclusiveCapability: a command of one session that
// looks up a name in a directory another session holds exclusively waits
// for the holder like a conflicting change, whatever the committed state
// would answer: B's remove of a file A has created but not sent yet
// recalls A's capability and removes the file once A has sent it (in a
// batch, at the recall) and released.
func TestCommandWaitsForExclusiveCapability(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, cfg *server.Config) { cfg.TickInterval = 50 * time.Millisecond }))
	leader := c.WaitLeader(10 * time.Second)
	f := follower(c, leader, 0)
	ctx := ctxTimeout(t, 60*time.Second)
	w, err := c.Client(leader.APIAddr()).Watch(ctx, &pb.WatchRequest{Version: pb.Version})
	require.NoError(t, err)
	recalls := make(chan *pb.Recall, 16)
	go func() {
		for {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			for _, r := range ev.Recalls {
				recalls <- r
			}
		}
	}()

	a := openSession(t, c.Client(f.APIAddr()))
	b := openSession(t, c.Client(leader.APIAddr()))
	a.mkdir("/d")
	d := stat(t, c.Client(f.APIAddr()), "/d", pb.Consistency_LINEARIZABLE).Attr.Ino
	g := a.apply(&pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{d}, Exclusive: true}}})
	require.Equal(t, []uint64{d}, g.Granted)
	r := a.apply(&pb.Command{Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: 4}}})
	require.Zero(t, r.Errno, r.Message)

	// A has answered the creation of /d/new itself; B removes it.
	got := make(chan *pb.Result, 1)
	go func() {
		res, err := b.tryApply(&pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Path: "/d/new"}}}})
		if err != nil {
			res = &pb.Result{Errno: 5, Message: err.Error()}
		}
		got <- res
	}()
	select {
	case rc := <-recalls:
		require.Equal(t, &pb.Recall{Session: a.id, Ino: d, Epoch: g.Epoch}, cleanRecall(rc))
	case res := <-got:
		t.Fatalf("the remove was answered without a recall: %v", res)
	case <-time.After(20 * time.Second):
		t.Fatal("no recall of the exclusive capability")
	}
	select {
	case res := <-got:
		t.Fatalf("the remove was answered before the holder released: %v", res)
	case <-time.After(300 * time.Millisecond):
	}
	// At the recall, the holder sends what it buffered, then releases.
	mk := &pb.Command{Op: &pb.Command_Mknod{Mknod: &pb.MknodCmd{Loc: &pb.Loc{Path: "/d/new"}, Mode: 0o644, Ino: r.FirstIno}}}
	bt := a.apply(&pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{
		Fences: []*pb.CapRef{{Ino: d, Epoch: g.Epoch}}, Commands: []*pb.Command{mk}}}})
	require.Zero(t, bt.Errno, bt.Message)
	created := bt.Results[0]
	a.apply(&pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: []*pb.CapRef{
		{Ino: d, Epoch: g.Epoch}, {Ino: r.FirstIno, Epoch: created.Epoch}}}}})
	select {
	case res := <-got:
		require.Zero(t, res.GetErrno(), res.GetMessage())
	case <-time.After(20 * time.Second):
		t.Fatal("the remove was not applied after the release")
	}
	res := stat(t, c.Client(f.APIAddr()), "/d/new", pb.Consistency_LINEARIZABLE)
	require.EqualValues(t, syscall.ENOENT, res.Errno, "the file the holder sent is gone")
}
