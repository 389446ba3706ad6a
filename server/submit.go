package server

import (
	"context"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Capability recalls on the leader. The state machine refuses a command
// that would change an inode another session holds a capability on
// (Result.recall) and announces the recall in its change events, which
// reach the holder through its Watch stream. The command is not recorded,
// so the leader applies it again under the same (session, seq) when a
// capability goes (released, or with its session or inode) or when the
// earliest recalled one is due for revocation on log time. A holder that
// never answers thus delays the command by at most its session's lease.

// revokeSlack is how long after a revocation is due (by this leader's
// clock) the command is tried again: the retry's own entry carries the
// time that makes the state machine revoke.
const revokeSlack = 5 * time.Millisecond

// apply commits a checked command: on the leader through submit, which
// waits through recalls; on a follower by forwarding it to the leader.
func (n *Node) apply(ctx context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	if !n.IsLeader() {
		return forwardUnary(ctx, n, "Apply", req, pb.MemFSClient.Apply)
	}
	res, idx, err := n.submit(ctx, req.Command)
	if err != nil {
		return nil, n.localErr(ctx, err)
	}
	return &pb.ApplyResponse{Result: res, Index: idx}, nil
}

// submit commits cmd, waiting through recalls until it passes or ctx ends.
func (n *Node) submit(ctx context.Context, cmd *pb.Command) (*pb.Result, uint64, error) {
	var start time.Time
	for {
		gone := n.fsm.CapsReleased()
		res, idx, err := n.submitDeduped(ctx, cmd)
		if err != nil || !res.GetRecall() {
			if !start.IsZero() {
				n.metrics.recallWait.Observe(time.Since(start).Seconds())
			}
			return res, idx, err
		}
		if start.IsZero() {
			start = time.Now()
		}
		if err := waitRecall(ctx, gone, n.fsm.NextRevoke()); err != nil {
			return nil, 0, err
		}
	}
}

// waitRecall waits until gone is closed or the revocation due at log time
// revokeAt (0: none) has come.
func waitRecall(ctx context.Context, gone <-chan struct{}, revokeAt int64) error {
	var due <-chan time.Time
	if revokeAt != 0 {
		t := time.NewTimer(time.Until(time.Unix(0, revokeAt)) + revokeSlack)
		defer t.Stop()
		due = t.C
	}
	select {
	case <-gone:
	case <-due:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
