package server

// Forwarding to the leader: a follower that gets a command, or a read it
// may not answer itself, passes the request to the leader it knows and the
// answer back. A request is forwarded once at most (isForwarded): a node
// that gets a forwarded request and does not lead answers UNAVAILABLE
// with a hint.

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// forwardUnary sends a request this node cannot answer to the leader and
// passes the answer back, keeping the leader's hint on UNAVAILABLE; method
// names the call in the forwarded-requests metric. call is the client's
// method, e.g. pb.MemFSClient.Apply.
func forwardUnary[Req, Resp any](ctx context.Context, n *Node, method string, req Req,
	call func(pb.MemFSClient, context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	cli, err := n.leaderClient(ctx)
	if err != nil {
		var none Resp
		return none, err
	}
	n.metrics.forwarded.WithLabelValues(method).Inc()
	var tr metadata.MD
	resp, err := call(cli, forwardContext(ctx), req, grpc.Trailer(&tr))
	return resp, n.forwardErr(ctx, err, tr)
}

func (n *Node) forwardRead(ctx context.Context, req *pb.QueryRequest, stream grpc.ServerStreamingServer[pb.ReadFrame]) error {
	cli, err := n.leaderClient(ctx)
	if err != nil {
		return err
	}
	n.metrics.forwarded.WithLabelValues("Read").Inc()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up, err := cli.Read(forwardContext(ctx), req)
	if err != nil {
		return n.forwardErr(ctx, err, nil)
	}
	for {
		f, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return n.forwardErr(stream.Context(), nil, nil)
		}
		if err != nil {
			return n.forwardErr(stream.Context(), err, up.Trailer())
		}
		if err := stream.Send(f); err != nil {
			return err
		}
	}
}

// forwardWrite relays a Write stream to the leader frame by frame. If the
// client's stream breaks, the upstream is cancelled before it is closed, so
// the leader applies nothing.
func (n *Node) forwardWrite(ctx context.Context, first *pb.WriteFrame,
	stream grpc.ClientStreamingServer[pb.WriteFrame, pb.ApplyResponse]) error {
	cli, err := n.leaderClient(ctx)
	if err != nil {
		return err
	}
	n.metrics.forwarded.WithLabelValues("Write").Inc()
	uctx, cancel := context.WithCancel(forwardContext(ctx))
	defer cancel()
	up, err := cli.Write(uctx)
	if err != nil {
		return n.forwardErr(ctx, err, nil)
	}
	have := len(first.GetCommand().GetWrite().GetData()) + len(first.Data)
	f := first
	for {
		if err := up.Send(f); err != nil {
			break // the leader ended the stream; its answer comes from CloseAndRecv
		}
		f, err = stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err // cancel (deferred) tells the leader to drop the write
		}
		if err := checkLaterFrame(f, have); err != nil {
			return err
		}
		have += len(f.Data)
	}
	resp, err := up.CloseAndRecv()
	if err := n.forwardErr(ctx, err, up.Trailer()); err != nil {
		return err
	}
	return stream.SendAndClose(resp)
}

// leaderClient returns a connection to the leader for forwarding, or the
// UNAVAILABLE answer (with a leader hint when known) to give instead.
func (n *Node) leaderClient(ctx context.Context) (pb.MemFSClient, error) {
	id, api := n.Leader()
	switch {
	case isForwarded(ctx):
		return nil, withLeaderHint(ctx, unavailableErr("node %s is not the leader (leader: %q)", n.cfg.ID, id), api)
	case id == "":
		return nil, unavailableErr("no leader known to node %s (election in progress?)", n.cfg.ID)
	case api == "":
		return nil, unavailableErr("leader %s has no known api address yet", id)
	}
	cli, err := n.peers.client(api)
	if err != nil {
		return nil, withLeaderHint(ctx, unavailableErr("connect to leader %s at %s: %v", id, api, err), api)
	}
	return cli, nil
}

// forwardErr passes the leader's answer through. An UNAVAILABLE answer
// keeps the leader's hint, or gets ours; a success names the leader too
// (nameLeader).
func (n *Node) forwardErr(ctx context.Context, err error, tr metadata.MD) error {
	if err == nil {
		n.nameLeader(ctx)
		return nil
	}
	if status.Code(err) != codes.Unavailable {
		return err
	}
	if hint := tr.Get(pb.LeaderTrailer); len(hint) > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(pb.LeaderTrailer, hint[0]))
		return err
	}
	_, api := n.Leader()
	return withLeaderHint(ctx, err, api)
}

// nameLeader puts the leader's API address in the trailer of a call this
// follower forwarded and the leader answered, so that the client sends
// its next calls to the leader itself: through a follower every byte
// crosses two connections instead of one (and, under TLS, is encrypted
// and decrypted twice).
func (n *Node) nameLeader(ctx context.Context) {
	if _, api := n.Leader(); api != "" && api != n.apiAddr {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(pb.LeaderTrailer, api))
	}
}

// localErr maps an error of this node's own Raft work to a status, with a
// leader hint on UNAVAILABLE.
func (n *Node) localErr(ctx context.Context, err error) error {
	st := toStatus(err)
	if status.Code(st) == codes.Unavailable {
		_, api := n.Leader()
		if api != n.apiAddr {
			return withLeaderHint(ctx, st, api)
		}
	}
	return st
}
