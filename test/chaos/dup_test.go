package chaos

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/harness"
)

// TestDelayedDuplicateAfterAck replays, after the client has moved on, a
// request that a network held back: a mkdir that was applied and answered,
// then a remove of the same directory (whose ack lets the state machine
// drop the mkdir's recorded result), then the held-back copy of the mkdir
// arrives. It must not run again: the directory stays removed.
//
// This is how the soak found directories coming back after their removal
// and appends applied twice (docs/testing.md, "Bugs the suite found"); the
// state machine now refuses (EALREADY) a command whose seq is below the
// highest ack its session has sent.
func TestDelayedDuplicateAfterAck(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: 3, Seed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := c.Client(ctx, "c0", nil)
	require.NoError(t, err)
	defer cl.Close()

	mkdir := &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a"}, Mode: 0o755}}}
	_, err = cl.Do(ctx, mkdir)
	require.NoError(t, err)
	held := proto.Clone(mkdir).(*pb.Command) // the copy the network held back
	remove := &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Path: "/a"}}}}
	_, err = cl.Do(ctx, remove)
	require.NoError(t, err)
	require.Greater(t, remove.GetAck(), held.GetSeq(), "the remove acknowledges the mkdir")

	// The held-back request reaches the leader now.
	l := c.WaitLeader(10 * time.Second)
	conn, err := grpc.NewClient(c.Node(l).APIAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := pb.NewMemFSClient(conn).Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: held})
	require.NoError(t, err)
	t.Logf("the held-back mkdir (session %d seq %d ack %d) got errno %d",
		held.GetSession(), held.GetSeq(), held.GetAck(), resp.GetResult().GetErrno())

	_, err = cl.WithContext(ctx).Stat("/a")
	require.True(t, errors.Is(err, fs.ErrNotExist),
		"the directory came back: a duplicate of an acknowledged mkdir ran again after its removal (stat: %v)", err)
}
