package server_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func grpcTrailer(md *metadata.MD) grpc.CallOption { return grpc.Trailer(md) }

func requireCode(t testing.TB, err error, code string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err).String(), "error: %v", err)
}

func TestRejectsBadRequests(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	for _, target := range []*server.Node{leader, follower(c, leader, 0)} {
		cli := c.Client(target.APIAddr())
		ctx := ctxTimeout(t, 20*time.Second)
		mkdir := &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/x"}}}}
		stat := &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/"}}}}
		cases := []struct {
			name string
			call func() error
			code codes.Code
			msg  string
		}{
			{"apply version", func() error {
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: 99, Command: mkdir})
				return err
			}, codes.FailedPrecondition, "protocol version 99"},
			{"query version", func() error {
				_, err := cli.Query(ctx, &pb.QueryRequest{Query: stat})
				return err
			}, codes.FailedPrecondition, "protocol version 0"},
			{"status version", func() error {
				_, err := cli.Status(ctx, &pb.StatusRequest{Version: 2})
				return err
			}, codes.FailedPrecondition, "version"},
			{"join version", func() error {
				_, err := cli.Join(ctx, &pb.JoinRequest{Version: 2, Id: "x"})
				return err
			}, codes.FailedPrecondition, "version"},
			{"remove version", func() error {
				_, err := cli.RemoveNode(ctx, &pb.RemoveNodeRequest{Id: "x"})
				return err
			}, codes.FailedPrecondition, "version"},
			{"read version", func() error { return recvErr(cli.Read(ctx, &pb.QueryRequest{Version: 7, Query: stat})) },
				codes.FailedPrecondition, "version"},
			{"write version", func() error {
				return writeFrames(ctx, cli, &pb.WriteFrame{Version: 3, Command: server.WriteCmd("/x", 0, nil)})
			}, codes.FailedPrecondition, "version"},
			{"apply without command", func() error {
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version})
				return err
			}, codes.InvalidArgument, "no command"},
			{"apply without op", func() error {
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: &pb.Command{Session: 1}})
				return err
			}, codes.InvalidArgument, "no operation"},
			{"query without query", func() error {
				_, err := cli.Query(ctx, &pb.QueryRequest{Version: pb.Version})
				return err
			}, codes.InvalidArgument, "no query"},
			{"query without op", func() error {
				_, err := cli.Query(ctx, &pb.QueryRequest{Version: pb.Version, Query: &pb.Query{}})
				return err
			}, codes.InvalidArgument, "no operation"},
			{"query bad consistency", func() error {
				_, err := cli.Query(ctx, &pb.QueryRequest{Version: pb.Version, Query: stat, Consistency: 9})
				return err
			}, codes.InvalidArgument, "consistency"},
			{"read of a stat", func() error { return recvErr(cli.Read(ctx, &pb.QueryRequest{Version: pb.Version, Query: stat})) },
				codes.InvalidArgument, "read query"},
			{"write of a mkdir", func() error {
				return writeFrames(ctx, cli, &pb.WriteFrame{Version: pb.Version, Command: mkdir})
			}, codes.InvalidArgument, "write command"},
			{"write declares too much", func() error {
				cmd := server.WriteCmd("/x", 0, nil)
				cmd.GetWrite().Length = server.MaxWriteBytes + 1
				return writeFrames(ctx, cli, &pb.WriteFrame{Version: pb.Version, Command: cmd})
			}, codes.InvalidArgument, "exceeds the limit"},
			{"write with two commands", func() error {
				return writeFrames(ctx, cli, &pb.WriteFrame{Version: pb.Version, Command: server.WriteCmd("/x", 0, nil)},
					&pb.WriteFrame{Command: server.WriteCmd("/x", 0, nil)})
			}, codes.InvalidArgument, "only the first frame"},
			{"join without addresses", func() error {
				_, err := cli.Join(ctx, &pb.JoinRequest{Version: pb.Version, Id: "n9"})
				return err
			}, codes.InvalidArgument, "raft_addr"},
			{"apply with sums", func() error {
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: summedWrite()})
				return err
			}, codes.InvalidArgument, "sums"},
			{"batch with sums", func() error {
				b := &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Commands: []*pb.Command{summedWrite()}}}}
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: b})
				return err
			}, codes.InvalidArgument, "sums"},
			{"write stream with sums", func() error {
				return writeFrames(ctx, cli, &pb.WriteFrame{Version: pb.Version, Command: summedWrite()})
			}, codes.InvalidArgument, "sums"},
			{"huge message", func() error {
				_, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: server.WriteCmd("/x", 0, make([]byte, 2<<20))})
				return err
			}, codes.ResourceExhausted, "larger than max"},
		}
		for _, tc := range cases {
			t.Run(target.ID()+"/"+tc.name, func(t *testing.T) {
				err := tc.call()
				require.Error(t, err)
				require.Equal(t, tc.code, status.Code(err), "%v", err)
				require.Contains(t, status.Convert(err).Message(), tc.msg)
			})
		}
	}
	// The refused writes with sums created nothing.
	r, err := c.Client(leader.APIAddr()).Query(ctxTimeout(t, 10*time.Second), &pb.QueryRequest{Version: pb.Version,
		Query: &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/summed"}}}}})
	require.NoError(t, err)
	require.Equal(t, uint32(syscall.ENOENT), r.GetResult().GetErrno())
}

// summedWrite is a write that carries sums, which only a leader may add:
// replicas would store its data under a hash it does not have.
func summedWrite() *pb.Command {
	data := make([]byte, 64<<10)
	data[0] = 1
	w := &pb.WriteCmd{Loc: &pb.Loc{Path: "/summed"}, Data: data, Create: true, Mode: 0o644,
		Length: uint64(len(data)), Hashes: [][]byte{nil}, Sums: [][]byte{make([]byte, 32)}}
	return &pb.Command{Op: &pb.Command_Write{Write: w}}
}

func recvErr(st grpc.ServerStreamingClient[pb.ReadFrame], err error) error {
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

// writeFrames sends frames on a Write stream and returns its outcome.
func writeFrames(ctx context.Context, cli pb.MemFSClient, frames ...*pb.WriteFrame) error {
	st, err := cli.Write(ctx)
	if err != nil {
		return err
	}
	for _, f := range frames {
		if err := st.Send(f); err != nil {
			break
		}
	}
	_, err = st.CloseAndRecv()
	return err
}

func TestWriteStreamCutOffAppliesNothing(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	for _, target := range []*server.Node{leader, follower(c, leader, 0)} {
		t.Run(target.ID(), func(t *testing.T) {
			cli := c.Client(target.APIAddr())
			s := openSession(t, cli)
			path := "/cut-" + target.ID()
			s.create(path)

			ctx, cancel := context.WithCancel(context.Background())
			st, err := cli.Write(ctx)
			require.NoError(t, err)
			s.seq++
			cmd := server.WriteCmd(path, 0, pattern(1000, 1))
			cmd.Session, cmd.Seq = s.id, s.seq
			require.NoError(t, st.Send(&pb.WriteFrame{Version: pb.Version, Command: cmd}))
			for range 3 {
				require.NoError(t, st.Send(&pb.WriteFrame{Data: pattern(pb.MaxMessageData, 2)}))
			}
			cancel() // the client disappears before closing its side
			_, err = st.CloseAndRecv()
			requireCode(t, err, "Canceled")

			// A later write through the same node and a linearizable stat:
			// the cut-off write never shows.
			s.create("/cut-marker-" + target.ID())
			res := stat(t, cli, path, pb.Consistency_LINEARIZABLE)
			require.Zero(t, res.Errno)
			require.Zero(t, res.Attr.Size, "a cut-off write must apply nothing")
		})
	}
}

func TestOversizedStreamedWriteIsRefused(t *testing.T) {
	c := servertest.StartCluster(t, 1)
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/big")
	ctx := ctxTimeout(t, 60*time.Second)
	st, err := cli.Write(ctx)
	require.NoError(t, err)
	cmd := server.WriteCmd("/big", 0, nil)
	cmd.Session, cmd.Seq = s.id, s.seq+1
	frame := make([]byte, pb.MaxMessageData)
	require.NoError(t, st.Send(&pb.WriteFrame{Version: pb.Version, Command: cmd}))
	for range server.MaxWriteBytes/pb.MaxMessageData + 1 {
		if st.Send(&pb.WriteFrame{Data: frame}) != nil {
			break // refused mid-stream
		}
	}
	_, err = st.CloseAndRecv()
	requireCode(t, err, "InvalidArgument")
	require.Zero(t, stat(t, cli, "/big", pb.Consistency_LINEARIZABLE).Attr.Size)
}
