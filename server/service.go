package server

import (
	"context"
	"errors"
	"io"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// service is the MemFS gRPC service of one node.
type service struct {
	pb.UnimplementedMemFSServer
	n *Node
}

func (s *service) Apply(ctx context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	if err := checkCommand(req.GetCommand()); err != nil {
		return nil, err
	}
	return s.n.apply(ctx, req)
}

func checkCommand(c *pb.Command) error {
	if c == nil {
		return badRequest("request carries no command")
	}
	if c.Op == nil {
		return badRequest("command has no operation")
	}
	if len(c.GetWrite().GetSums()) > 0 {
		// Replicas trust sums as the hashes of the data: only the leader,
		// which computed them, may put them in the log.
		return badRequest("write carries sums, which only the leader sets")
	}
	for _, nc := range c.GetBatch().GetCommands() {
		if len(nc.GetWrite().GetSums()) > 0 {
			return badRequest("a write in the batch carries sums, which only the leader sets")
		}
	}
	return nil
}

func checkQuery(q *pb.Query) error {
	if q == nil {
		return badRequest("request carries no query")
	}
	if q.Q == nil {
		return badRequest("query has no operation")
	}
	return nil
}

func (s *service) Query(ctx context.Context, req *pb.QueryRequest) (*pb.QueryResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	if err := checkQuery(req.GetQuery()); err != nil {
		return nil, err
	}
	req = clampRead(req, pb.MaxMessageData)
	n := s.n
	local, err := n.servesLocally(ctx, req.Consistency)
	if err != nil {
		return nil, err
	}
	if !local {
		return forwardUnary(ctx, n, "Query", req, pb.MemFSClient.Query)
	}
	if err := n.touchBuffered(ctx, req); err != nil {
		return nil, err
	}
	res, err := n.queryLocal(ctx, req)
	if err != nil {
		return nil, err
	}
	return &pb.QueryResponse{Result: res, Index: n.AppliedIndex()}, nil
}

// clampRead caps the length of a read query: a unary answer carries at
// most one message of data, a stream at most MaxReadBytes. The caller sees
// a short read and continues at the next offset.
func clampRead(req *pb.QueryRequest, limit int64) *pb.QueryRequest {
	rq := req.GetQuery().GetRead()
	if rq == nil || rq.Length <= limit {
		return req
	}
	c := proto.Clone(req).(*pb.QueryRequest)
	c.Query.GetRead().Length = limit
	return c
}

func (s *service) Read(req *pb.QueryRequest, stream grpc.ServerStreamingServer[pb.ReadFrame]) error {
	if err := checkVersion(req.GetVersion()); err != nil {
		return err
	}
	if err := checkQuery(req.GetQuery()); err != nil {
		return err
	}
	if req.Query.GetRead() == nil {
		return badRequest("Read takes a read query")
	}
	req = clampRead(req, MaxReadBytes)
	n, ctx := s.n, stream.Context()
	local, err := n.servesLocally(ctx, req.Consistency)
	if err != nil {
		return err
	}
	if !local {
		return n.forwardRead(ctx, req, stream)
	}
	if err := n.touchBuffered(ctx, req); err != nil {
		return err
	}
	res, err := n.queryLocal(ctx, req)
	if err != nil {
		return err
	}
	return sendRead(res, stream)
}

func (s *service) Write(stream grpc.ClientStreamingServer[pb.WriteFrame, pb.ApplyResponse]) error {
	n, ctx := s.n, stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := checkVersion(first.GetVersion()); err != nil {
		return err
	}
	if err := checkCommand(first.GetCommand()); err != nil {
		return err
	}
	w := first.Command.GetWrite()
	if w == nil {
		return badRequest("Write takes a write command")
	}
	if len(w.Hashes) == 0 && w.Length > MaxWriteBytes {
		return badRequest("write of %d bytes exceeds the limit of %d bytes", w.Length, MaxWriteBytes)
	}
	if !n.IsLeader() {
		return n.forwardWrite(ctx, first, stream)
	}
	size := len(w.Data) + len(first.Data)
	if size > MaxWriteBytes {
		return badRequest("write exceeds the limit of %d bytes", MaxWriteBytes)
	}
	// Preallocate only a little of a declared length: a client could
	// declare 64 MiB on many streams and send nothing.
	buf := make([]byte, 0, max(size, int(min(w.Length, maxWritePrealloc))))
	buf = append(append(buf, w.Data...), first.Data...)
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err // cut off: nothing applied
		}
		if err := checkLaterFrame(f, len(buf)); err != nil {
			return err
		}
		buf = append(buf, f.Data...)
	}
	w.Data = buf
	res, idx, err := n.submit(ctx, first.Command)
	if err != nil {
		return n.localErr(ctx, err)
	}
	return stream.SendAndClose(&pb.ApplyResponse{Result: res, Index: idx})
}

// maxWritePrealloc caps the buffer reserved up front for a streamed write.
const maxWritePrealloc = 4 << 20

// checkLaterFrame validates a Write frame after the first one.
func checkLaterFrame(f *pb.WriteFrame, have int) error {
	if f.Command != nil {
		return badRequest("only the first frame of a Write carries a command")
	}
	if have+len(f.Data) > MaxWriteBytes {
		return badRequest("write exceeds the limit of %d bytes", MaxWriteBytes)
	}
	return nil
}

func (s *service) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	n := s.n
	if !req.Local && !n.IsLeader() && !isForwarded(ctx) {
		// The leader's configuration is the newest: a follower's may not yet
		// show a node that was just added or removed.
		if cli, err := n.leaderClient(ctx); err == nil {
			if resp, err := cli.Status(forwardContext(ctx), req); err == nil {
				return resp, nil
			}
		}
	}
	return n.status(ctx, req.Local), nil
}

func (s *service) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	n := s.n
	if !n.IsLeader() {
		return forwardUnary(ctx, n, "Join", req, pb.MemFSClient.Join)
	}
	if err := n.addMember(ctx, req); err != nil {
		return nil, n.localErr(ctx, err)
	}
	return &pb.JoinResponse{}, nil
}

func (s *service) RemoveNode(ctx context.Context, req *pb.RemoveNodeRequest) (*pb.RemoveNodeResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	n := s.n
	if !n.IsLeader() {
		return forwardUnary(ctx, n, "RemoveNode", req, pb.MemFSClient.RemoveNode)
	}
	if err := n.removeMember(ctx, req.GetId()); err != nil {
		return nil, n.localErr(ctx, err)
	}
	return &pb.RemoveNodeResponse{}, nil
}

func (s *service) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchEvent]) error {
	if err := checkVersion(req.GetVersion()); err != nil {
		return err
	}
	w := s.n.watchers.subscribe()
	defer s.n.watchers.unsubscribe(w)
	// The client waits for the header to know it is subscribed; a
	// confined client may see no event for a long time.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	c, _ := callerOf(stream.Context())
	for {
		select {
		case ev := <-w.ch:
			if c.root != "" {
				// A confined client sees only changes inside its
				// directory, in its numbering.
				if ev = s.n.fsm.Confined(ev, c.root, c.owner); ev == nil {
					continue
				}
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-w.lost:
			return w.err()
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-s.n.ctx.Done():
			// The node is stopping: end the stream so a graceful stop
			// need not wait for watchers (a mounted client never leaves).
			return status.Error(codes.Unavailable, "node is stopping")
		}
	}
}

// recoverUnary turns a panic in a handler into INTERNAL, logged, instead of
// a crash. It is the last resort: handlers validate their input first.
func (n *Node) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler) (resp any, err error) {
	defer n.recoverTo(info.FullMethod, &err)
	return handler(ctx, req)
}

func (n *Node) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo,
	handler grpc.StreamHandler) (err error) {
	defer n.recoverTo(info.FullMethod, &err)
	return handler(srv, ss)
}

func (n *Node) recoverTo(method string, err *error) {
	if r := recover(); r != nil {
		n.metrics.panics.Inc()
		n.log.Error("panic in request handler", "method", method, "panic", r, "stack", string(debug.Stack()))
		*err = status.Errorf(codes.Internal, "internal error in %s (logged on node %s)", method, n.cfg.ID)
	}
}
