package server

import (
	"context"
	"errors"
	"io"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/proto"
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

// apply commits a checked command: on the leader through submit, which
// waits through recalls; on a follower by forwarding it to the leader.
func (n *Node) apply(ctx context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	if !n.IsLeader() {
		cli, err := n.leaderClient(ctx)
		if err != nil {
			return nil, err
		}
		n.metrics.forwarded.WithLabelValues("Apply").Inc()
		var tr metadata.MD
		resp, err := cli.Apply(forwardContext(ctx), req, grpc.Trailer(&tr))
		return resp, n.forwardErr(ctx, err, tr)
	}
	res, idx, err := n.submit(ctx, req.Command)
	if err != nil {
		return nil, n.localErr(ctx, err)
	}
	return &pb.ApplyResponse{Result: res, Index: idx}, nil
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
		cli, err := n.leaderClient(ctx)
		if err != nil {
			return nil, err
		}
		n.metrics.forwarded.WithLabelValues("Query").Inc()
		var tr metadata.MD
		resp, err := cli.Query(forwardContext(ctx), req, grpc.Trailer(&tr))
		return resp, n.forwardErr(ctx, err, tr)
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

// servesLocally decides where a query runs: STALE here, LINEARIZABLE here
// only on the leader (after confirming it still leads), else on the
// leader.
func (n *Node) servesLocally(ctx context.Context, c pb.Consistency) (bool, error) {
	switch c {
	case pb.Consistency_STALE:
		return true, nil
	case pb.Consistency_LINEARIZABLE:
	default:
		return false, badRequest("unknown consistency level %d", c)
	}
	if !n.IsLeader() {
		return false, nil
	}
	if err := n.readBarrier(ctx); err != nil {
		return false, n.localErr(ctx, err)
	}
	return true, nil
}

// readBarrier returns once this node may answer a linearizable read: it
// has confirmed its leadership with a quorum after the read arrived, and
// applied everything committed before that.
func (n *Node) readBarrier(ctx context.Context) error {
	term := n.raft.CurrentTerm()
	rctx, cancel := context.WithTimeout(ctx, 2*n.cfg.Raft.ElectionTimeout)
	readyIdx, err := n.ready.wait(rctx, term)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return raft.ErrLeadershipLost
	}
	idx := max(n.raft.CommitIndex(), readyIdx)
	if err := n.confirmLeadership(ctx, term); err != nil {
		return err
	}
	if n.raft.CurrentTerm() != term {
		return raft.ErrLeadershipLost
	}
	return n.rfsm.waitApplied(ctx, idx)
}

// touchBuffered waits, before a linearizable read is answered here, until
// no other session holds an exclusive capability on what the read covers
// (fsm.BufferedBy): such a holder may have acknowledged changes it has not
// sent. It applies a TouchCmd naming those inodes, which the state
// machine refuses for a recall until the holder has released them (after
// sending what it buffered) or lost them, and then waits until this node
// has applied it. Inodes the read reaches only through what the holder
// sent are looked at again; one already touched is not waited for twice,
// since a holder that took it back after the touch has acknowledged
// nothing the read must see.
func (n *Node) touchBuffered(ctx context.Context, req *pb.QueryRequest) error {
	if req.Consistency != pb.Consistency_LINEARIZABLE {
		return nil
	}
	var touched map[uint64]bool
	for {
		var inos []uint64
		for _, ino := range n.fsm.BufferedBy(req.Query, req.Session) {
			if !touched[ino] {
				inos = append(inos, ino)
			}
		}
		if len(inos) == 0 {
			return nil
		}
		resp, err := n.touch(ctx, req.Session, inos)
		if err != nil {
			return err
		}
		if err := n.rfsm.waitApplied(ctx, resp.Index); err != nil {
			return n.localErr(ctx, err)
		}
		if touched == nil {
			touched = make(map[uint64]bool)
		}
		for _, ino := range inos {
			touched[ino] = true
		}
	}
}

// touch applies a TouchCmd of session for inos. A session the state
// machine does not know (a client whose session expired, or one that
// named none) must not fail the read: the touch is then made without one.
func (n *Node) touch(ctx context.Context, session uint64, inos []uint64) (*pb.ApplyResponse, error) {
	cmd := func(s uint64) *pb.ApplyRequest {
		return &pb.ApplyRequest{Version: pb.Version, Command: &pb.Command{
			Session: s, Op: &pb.Command_Touch{Touch: &pb.TouchCmd{Inos: inos}}}}
	}
	resp, err := n.apply(ctx, cmd(session))
	if err == nil && session != 0 && resp.GetResult().GetErrno() == uint32(syscall.ESTALE) {
		resp, err = n.apply(ctx, cmd(0))
	}
	if err != nil {
		return nil, err
	}
	if e := resp.GetResult().GetErrno(); e != 0 {
		return nil, status.Errorf(codes.Internal, "touch of %d inodes before a read: %s (errno %d)", len(inos), resp.Result.Message, e)
	}
	return resp, nil
}

// queryLocal answers from this node's state. A HandleQuery with wait
// long-polls until the handle is no longer queued, a LockQuery with wait
// until its waiter no longer waits.
func (n *Node) queryLocal(ctx context.Context, req *pb.QueryRequest) (*pb.Result, error) {
	start := time.Now()
	defer func() {
		n.metrics.queryLatency.WithLabelValues(req.Consistency.String()).Observe(time.Since(start).Seconds())
	}()
	wait := req.Query.GetHandle().GetWait() || req.Query.GetLock().GetWait() || req.Query.GetRegion().GetWait()
	for {
		changed := n.fsm.Changed()
		res := n.fsm.Query(req.Query)
		if res == nil {
			return nil, status.Error(codes.Internal, "state machine returned no result")
		}
		if !wait || !res.GetQueued() {
			return res, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return res, nil
		case <-n.ctx.Done():
			return res, nil
		}
	}
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

// sendRead streams res: the first frame carries the result (without data)
// and the first piece of data, later frames only data.
func sendRead(res *pb.Result, stream grpc.ServerStreamingServer[pb.ReadFrame]) error {
	data := res.Data
	res.Data = nil
	first := true
	for first || len(data) > 0 {
		piece := data[:min(len(data), pb.MaxMessageData)]
		data = data[len(piece):]
		f := &pb.ReadFrame{Data: piece}
		if first {
			f.Result = res
			first = false
		}
		if err := stream.Send(f); err != nil {
			return err
		}
	}
	return nil
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
		cli, err := n.leaderClient(ctx)
		if err != nil {
			return nil, err
		}
		var tr metadata.MD
		resp, err := cli.Join(forwardContext(ctx), req, grpc.Trailer(&tr))
		return resp, n.forwardErr(ctx, err, tr)
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
		cli, err := n.leaderClient(ctx)
		if err != nil {
			return nil, err
		}
		var tr metadata.MD
		resp, err := cli.RemoveNode(forwardContext(ctx), req, grpc.Trailer(&tr))
		return resp, n.forwardErr(ctx, err, tr)
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
