package server

// Reads on this node: whether it may answer a query itself at the asked
// consistency (servesLocally, the read barrier of readindex.go), the
// access times a read moves (touch), and the answer (queryLocal, sendRead).

import (
	"context"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

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
