package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// errNoLeader: the cluster has no known leader (an election is running) or
// this node does not know where it is.
var errNoLeader = errors.New("no leader known")

// unavailable lists the errors after which the request may not have been
// applied, or may have been applied without an answer, and the client must
// retry (with the same session and seq) on the leader.
var unavailable = []error{
	raft.ErrNotLeader,
	raft.ErrLeadershipLost,
	raft.ErrLeadershipTransferInProgress,
	raft.ErrRaftShutdown,
	raft.ErrEnqueueTimeout,
	raft.ErrAbortedByRestore,
	raft.ErrNotVoter,
	errNoLeader,
	errBatcherClosed,
}

// toStatus turns an internal error into the gRPC status the client sees.
// It is the one place that chooses codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	for _, u := range unavailable {
		if errors.Is(err, u) {
			return status.Error(codes.Unavailable, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

func badRequest(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// checkVersion refuses a request of another protocol version.
func checkVersion(v uint32) error {
	if v != pb.Version {
		return status.Errorf(codes.FailedPrecondition,
			"protocol version %d not supported: this node speaks version %d (upgrade the client or the node)", v, pb.Version)
	}
	return nil
}

// withLeaderHint attaches the leader's API address to an UNAVAILABLE answer
// so the client can go there directly.
func withLeaderHint(ctx context.Context, err error, leaderAPI string) error {
	if status.Code(err) == codes.Unavailable && leaderAPI != "" {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(pb.LeaderTrailer, leaderAPI))
	}
	return err
}

// unavailableErr is an UNAVAILABLE status with a reason.
func unavailableErr(format string, args ...any) error {
	return status.Error(codes.Unavailable, fmt.Sprintf(format, args...))
}
